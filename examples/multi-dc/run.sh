#!/bin/sh
# Starts three data centers, ams, fra and lon, of NODES nodes each (1 by default, at most 9) on
# loopback: DC d's node i on 127.0.0.(100 + 10d + i), all on PORT (default 8379), as on
# separate machines. Every node lists all the others with their `datacenter:` (the election
# stays inside each DC; the other DCs' nodes are the entry points of the mesh) and shares one
# election key, which signs the exchanges. All run examples/multi-dc's scheduler, on one copy of
# the config dir: edit its runtime/site.yaml and watch the DCs lend and borrow. Ctrl-C stops
# everything.
#
#   examples/multi-dc/run.sh             (or: make multi-dc)
#   NODES=3 examples/multi-dc/run.sh     (or: make multi-dc NODES=3)
#
# State goes to target/multi-dc/ (MULTI_DC_DIR). The binary is built in release mode first,
# unless VERWALTER names one to use instead.
set -eu
cd "$(dirname "$0")/../.."
PORT=${PORT:-8379}
NODES=${NODES:-1}
DIR=${MULTI_DC_DIR:-target/multi-dc}
DCS="ams fra lon"

if [ "$NODES" -lt 1 ] || [ "$NODES" -gt 9 ]; then
    echo "NODES must be between 1 and 9" >&2
    exit 2
fi
if [ -n "${VERWALTER:-}" ]; then
    echo "using $VERWALTER"
else
    echo "building target/release/verwalter (cargo build --release; from nothing about 8 minutes on 2 cores)"
    cargo build --release -p verwalter --bin verwalter
    VERWALTER=target/release/verwalter
fi

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
rm -rf "$DIR/config"
cp -r examples/multi-dc "$DIR/config"
rm -f "$DIR/config/run.sh" "$DIR/config/README.md"
printf 'the shared key of the multi-dc example site\n' >"$DIR/cluster.key"

pids=""
cleanup() {
    trap - EXIT INT TERM
    # shellcheck disable=SC2086
    kill $pids 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip() { echo "127.0.0.$((100 + 10 * $1 + $2))"; }
id() { printf '77985419c732412ea38b94dd%04d%04d' "$1" "$2"; }

# Every node of the site: "d i dc" per line.
nodes() {
    d=0
    for dc in $DCS; do
        d=$((d + 1))
        i=0
        while [ "$i" -lt "$NODES" ]; do
            i=$((i + 1))
            echo "$d $i $dc"
        done
    done
}

nodes | while read -r d i dc; do
    name="$dc-$i"
    node="$DIR/$name"
    mkdir -p "$node"
    {
        echo "datacenter: $dc"
        echo "election:"
        echo "  key-file: $DIR/cluster.key"
        echo "peers:"
        nodes | while read -r pd pi pdc; do
            if [ "$pd $pi" != "$d $i" ]; then
                echo "- {id: $(id "$pd" "$pi"), addr: \"$(ip "$pd" "$pi"):$PORT\", hostname: $pdc-$pi, datacenter: $pdc}"
            fi
        done
    } >"$node/settings.yaml"
done

for line in $(nodes | tr ' ' ':'); do
    d=${line%%:*}
    rest=${line#*:}
    i=${rest%%:*}
    dc=${rest#*:}
    name="$dc-$i"
    node="$DIR/$name"
    RUST_LOG=${RUST_LOG:-info} "$VERWALTER" run \
        --hostname "$name" --host "$(ip "$d" "$i")" --port "$PORT" \
        --override-machine-id "$(id "$d" "$i")" --settings "$node/settings.yaml" \
        --config-dir "$DIR/config" --storage-dir "$node/storage" --log-dir "$node/log" \
        2>"$node/verwalter.log" &
    pids="$pids $!"
    echo "$name: http://$(ip "$d" "$i"):$PORT/v1/datacenters  (log: $node/verwalter.log)"
done
echo "3 data centers of $NODES node(s) on 127.0.0.111-$(ip 3 "$NODES"):$PORT"
echo "Where to look, on each DC's leader:"
echo "  /v1/datacenters       the other DCs: link, RTT, summary, requests, answers, what is lent"
echo "  /v1/scheduler_input   state.datacenters, as the scheduler sees it"
echo "  /v1/schedule          the schedule: borrowed and lent workers"
echo "  /metrics              verwalter_dc_* per other DC"
echo "Edit $DIR/config/runtime/site.yaml (demand per DC) to see workers lent and taken back."
echo "Ctrl-C stops all."
wait
