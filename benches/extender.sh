#!/bin/sh
# The scheduler extender through its real HTTP server (issue 13): wrk POSTs a kube-scheduler
# request with 5,000 NodeNames to /filter and /prioritize of a release-built `verwalter
# extender`, pinned to one core (`taskset -c 0`), wrk on the other. The cluster is the one of
# placement/benches/extender.rs: 5,000 nodes each running three of 50 apps, LeastUsedBAR on cpu
# and mem. Needs Debian's `wrk` (installed when missing and run as root with apt-get).
#
#   benches/extender.sh     (DURATION=10s CONNECTIONS=4 NODES=5000 NICE=0 by default)
#
# On a machine busy with other work, NICE=-10 (as root) gives the server and wrk their cores
# first, so that the figures are the extender's and not the neighbours'.
set -eu
cd "$(dirname "$0")/.."
if ! command -v wrk >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk
    else
        echo "wrk not found: apt-get install wrk" >&2; exit 1
    fi
fi
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-4}
NODES=${NODES:-5000}
NICE=${NICE:-0}
cargo build --release --quiet --bin verwalter
mkdir -p target
dir=$(mktemp -d target/bench-extender.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$dir"' EXIT

printf 'algorithms:\n  least-used-bar: !LeastUsedBAR {dimensions: [cpu, mem]}\n' > "$dir/config.yaml"
awk -v nodes="$NODES" 'BEGIN {
    apps = 50
    printf "{\"apps_spec\": {"
    for (a = 0; a < apps; a++)
        printf "%s\"app-%02d\": {\"cpu\": %d, \"mem\": %d}", (a ? ", " : ""), a, 1 + a % 4, 2 + (a % 8) * 2
    printf "},\n\"node_capacities\": {"
    for (n = 0; n < nodes; n++) {
        big = (n % 3 == 0) ? 2 : 1
        printf "%s\"node-%04d\": {\"cpu\": %d, \"mem\": %d}", (n ? ",\n" : ""), n, 40 * big, 192 * big
    }
    printf "},\n\"assigned_apps\": {"
    for (n = 0; n < nodes; n++) {
        printf "%s\"node-%04d\": {", (n ? ",\n" : ""), n
        for (k = 0; k < 3; k++)
            printf "%s\"app-%02d\": %d", (k ? ", " : ""), (n * 7 + k * 13) % apps, 1 + (n + k) % 2
        printf "}"
    }
    printf "}}\n"
}' > "$dir/snapshot.json"
awk -v nodes="$NODES" 'BEGIN {
    printf "{\"Pod\":{\"metadata\":{\"name\":\"app-07-x2k4p\",\"namespace\":\"default\",\"labels\":{\"app\":\"app-07\"}},\"spec\":{\"containers\":[{\"name\":\"main\",\"image\":\"app:1\"}]}},\"Nodes\":null,\"NodeNames\":["
    for (n = 0; n < nodes; n++) printf "%s\"node-%04d\"", (n ? "," : ""), n
    printf "]}"
}' > "$dir/body.json"
cat > "$dir/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open("$dir/body.json", "r"))
wrk.body = f:read("*a")
f:close()
LUA

nice -n "$NICE" taskset -c 0 target/release/verwalter extender --config "$dir/config.yaml" \
    --listen 127.0.0.1:0 --snapshot "$dir/snapshot.json" 2>"$dir/extender.log" &
pid=$!
# --listen with port 0: the system picks the port; the `Extender listening. addr=IP:PORT` line says which.
port=
for _ in $(seq 100); do
    port=$(sed -n 's/.*Extender listening\..*addr=[0-9.]*:\([0-9]*\).*/\1/p' "$dir/extender.log" | head -1)
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || { echo "the extender did not start:" >&2; cat "$dir/extender.log" >&2; exit 1; }
echo "body: $(wc -c < "$dir/body.json") bytes, $NODES NodeNames; server on core 0, wrk on core 1"
for verb in filter prioritize; do
    echo "== /$verb (1 thread, $CONNECTIONS connections, $DURATION)"
    nice -n "$NICE" taskset -c 1 wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$dir/post.lua" \
        "http://127.0.0.1:$port/$verb" | grep -E "Requests/sec|Latency  |  (50|90|99)%|requests in|Non-2xx"
done
