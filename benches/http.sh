#!/bin/sh
# HTTP throughput (issue 5): wrk against /v1/status and /metrics of a release-built daemon on a
# copy of examples/minimal (single node, loopback). Needs Debian's `wrk` (apt-get install wrk).
#
#   benches/http.sh            (DURATION=10s CONNECTIONS=64 THREADS=2 by default)
set -eu
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 1; }
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
cargo build --release --quiet --bin verwalter
dir=$(mktemp -d target/bench-http.XXXXXX)
cp -r examples/minimal "$dir/config"
target/release/verwalter run --config-dir "$dir/config" --storage-dir "$dir/storage" \
    --log-dir "$dir/log" --port 0 --override-machine-id 0000000000000000000000000000b3e0 \
    2>"$dir/verwalter.log" &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
# --port 0: the system picks the port; the daemon's `Listening. addr=IP:PORT` line says which.
port=
for _ in $(seq 100); do
    port=$(sed -n 's/.*Listening\..*addr=[0-9.]*:\([0-9]*\).*/\1/p' "$dir/verwalter.log" | head -1)
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/v1/schedule" >/dev/null 2>&1 && break
    sleep 0.1
done
[ -n "$port" ] || { echo "the daemon did not start:" >&2; cat "$dir/verwalter.log" >&2; exit 1; }
for path in /v1/status /metrics; do
    echo "== $path ($THREADS threads, $CONNECTIONS connections, $DURATION)"
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" "http://127.0.0.1:$port$path" | grep -E "Requests/sec|Latency|requests in"
done
