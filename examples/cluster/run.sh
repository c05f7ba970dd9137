#!/bin/sh
# Starts a local verwalter cluster of N nodes (3 by default) on 127.0.0.1, 127.0.0.2, ... (one
# port, as on separate machines), with the cantal test double serving the peer list, each node
# on its own copy of examples/minimal. Ctrl-C stops everything.
#
#   examples/cluster/run.sh          (or: make cluster)
#   N=100 examples/cluster/run.sh    (or: make cluster N=100; at most 254)
#
# Three nodes are alpha, beta and gamma; more are node-001, node-002, ... State goes to
# target/cluster/. PORT (default 8379) and CANTAL_PORT (default 22682) can be set.
set -eu
cd "$(dirname "$0")/../.."
PORT=${PORT:-8379}
CANTAL_PORT=${CANTAL_PORT:-22682}
DIR=target/cluster
N=${N:-3}
if [ "$N" -lt 1 ] || [ "$N" -gt 254 ]; then
    echo "N must be between 1 and 254 (one 127.0.0.x address per node)" >&2
    exit 2
fi
if [ "$N" -eq 3 ]; then
    NAMES="alpha beta gamma"
else
    NAMES=$(seq -f 'node-%03g' 1 "$N")
fi

cargo build --release --quiet --bin verwalter --example fake_cantal
mkdir -p "$DIR"
pids=""
cleanup() {
    # shellcheck disable=SC2086
    kill $pids 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

# shellcheck disable=SC2046
target/release/examples/fake_cantal --listen "127.0.0.1:$CANTAL_PORT" \
    $(for name in $NAMES; do echo "$name.local"; done) 2>"$DIR/cantal.log" &
pids="$pids $!"

n=0
for name in $NAMES; do
    n=$((n + 1))
    node="$DIR/$name"
    mkdir -p "$node"
    rm -rf "$node/config"
    cp -r examples/minimal "$node/config"
    RUST_LOG=${RUST_LOG:-info} target/release/verwalter run \
        --hostname "$name" --name "$name.local" \
        --host "127.0.0.$n" --port "$PORT" \
        --override-machine-id "$(printf '77985419c732412ea38b94db%08d' "$n")" \
        --config-dir "$node/config" --storage-dir "$node/storage" --log-dir "$node/log" \
        --cantal-url "http://127.0.0.1:$CANTAL_PORT" 2>"$node/verwalter.log" &
    pids="$pids $!"
    if [ "$N" -le 10 ]; then
        echo "$name: http://127.0.0.$n:$PORT/v1/status.pretty  (log: $node/verwalter.log)"
    fi
done
echo "$N nodes on 127.0.0.1-$N:$PORT (logs: $DIR/<name>/verwalter.log)"
echo "leader: http://127.0.0.1:$PORT/v1/leader-redirect-by-node-name/v1/status.pretty"
echo "  (names resolve only if alpha.local etc. are in /etc/hosts; the status pages above work as they are)"
echo "Edit $DIR/<leader>/config/runtime/... to see a new schedule reach every node. Ctrl-C stops."
wait
