#!/usr/bin/env bash
# Resident memory of the idle daemon on examples/minimal (release build; or the binary named by
# VERWALTER_BIN, e.g. the packaged one: VERWALTER_BIN=target/pkg/verwalter after `make package`).
# Starts the daemon three times, lets each settle for 5 s after its first schedule, reads VmRSS,
# and prints each reading and the median.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VERWALTER_BIN:-}" ]; then
    cargo build --release --quiet
fi
bin=${VERWALTER_BIN:-target/release/verwalter}
readings=()
for run in 1 2 3; do
    tmp=$(mktemp -d)
    cp -r examples/minimal "$tmp/config"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$bin" run --config-dir "$tmp/config" --storage-dir "$tmp/storage" --log-dir "$tmp/log" \
        --port "$port" --override-machine-id 0000000000000000000000000000be0c 2>"$tmp/log.txt" &
    pid=$!
    for _ in $(seq 100); do
        curl -sf "127.0.0.1:$port/v1/schedule" >/dev/null && break
        sleep 0.1
    done
    sleep 5
    rss_kib=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
    kill "$pid"; wait "$pid" || true
    rm -rf "$tmp"
    readings+=("$rss_kib")
    awk -v r="$run" -v k="$rss_kib" 'BEGIN { printf "run %d: VmRSS %d KiB (%.1f MiB)\n", r, k, k / 1024 }'
done
printf '%s\n' "${readings[@]}" | sort -n | awk '{ v[NR] = $1 }
    END { printf "median idle RSS: %.1f MiB (min %.1f, max %.1f)\n", v[2] / 1024, v[1] / 1024, v[3] / 1024 }'
