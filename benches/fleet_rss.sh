#!/usr/bin/env bash
# Resident memory of one daemon at fleet size (issue 15): a static list of 1,000 peers (addresses
# on 127.1.x.y where nobody answers, so the node pings all of them every heartbeat) and 500 roles
# on this node (examples/minimal with 498 more roles under runtime/, each rendered and applied).
# The node leads by --debug-force-leader (1,000 silent peers would never vote). Release build, or
# the binary named by VERWALTER_BIN. Prints VmRSS once all 500 roles applied, and again after
# 20 s more of pinging and re-reading (three runs, and the median of the later readings).
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
    for i in $(seq 1 498); do
        mkdir -p "$tmp/config/runtime/role$i"
        printf 'image: role%d.v1\ninstances: 1\n' "$i" >"$tmp/config/runtime/role$i/v1.yaml"
    done
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    {
        echo "peers:"
        for i in $(seq 1 1000); do
            printf '  - {id: "%032x", addr: "127.1.%d.%d:%d", hostname: "peer%d", name: "peer%d.test"}\n' \
                $((0x1000 + i)) $((i / 250)) $((i % 250 + 1)) "$port" "$i" "$i"
        done
    } >"$tmp/settings.yaml"
    "$bin" run --config-dir "$tmp/config" --storage-dir "$tmp/storage" --log-dir "$tmp/log" \
        --settings "$tmp/settings.yaml" --host 127.0.0.1 --port "$port" --debug-force-leader \
        --override-machine-id 0000000000000000000000000000be0c 2>"$tmp/log.txt" &
    pid=$!
    applied=0
    for _ in $(seq 600); do
        applied=$(ls "$tmp/storage/roles" 2>/dev/null | grep -c '\.applied$' || true)
        [ "$applied" -ge 500 ] && break
        sleep 0.1
    done
    peers=$(curl -sf "127.0.0.1:$port/v1/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["peers"])')
    first=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
    sleep 20
    later=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
    kill "$pid"; wait "$pid" || true
    rm -rf "$tmp"
    readings+=("$later")
    awk -v r="$run" -v a="$applied" -v p="$peers" -v f="$first" -v l="$later" 'BEGIN {
        printf "run %d: %d peers, %d roles applied: VmRSS %.1f MiB, 20 s later %.1f MiB\n", r, p, a, f / 1024, l / 1024 }'
done
printf '%s\n' "${readings[@]}" | sort -n | awk '{ v[NR] = $1 }
    END { printf "median RSS with 1,000 peers and 500 roles: %.1f MiB (min %.1f, max %.1f)\n", v[2] / 1024, v[1] / 1024, v[3] / 1024 }'
