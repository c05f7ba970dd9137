#!/bin/sh
# Starts a local verwalter cluster of N nodes (3 by default) on 127.0.0.1, 127.0.0.2, ... (one
# port, as on separate machines), with the cantal test double serving the peer list, each node
# on its own copy of examples/minimal. Ctrl-C stops everything.
#
#   examples/cluster/run.sh            (or: make cluster)
#   N=100 examples/cluster/run.sh      (or: make cluster N=100; at most 254)
#   examples/cluster/run.sh stop NAME  (or: make cluster-stop NODE=NAME): stops one node
#
# Three nodes are alpha, beta and gamma; more are node-001, node-002, ... State goes to
# target/cluster/ (CLUSTER_DIR): per node its config, storage, log dir, `verwalter.log` and,
# while it runs, `pid`. With up to 10 nodes every node's log lines are also printed here, each
# prefixed with the node's name (LABELS=0 turns that off, LABELS=1 on for more nodes).
# PORT (default 8379) and CANTAL_PORT (default 22682) can be set; 0 lets the system pick (then
# the other nodes take the port node 1 was given). The binaries are built in
# release mode first, unless VERWALTER and FAKE_CANTAL name binaries to use instead.
set -eu
cd "$(dirname "$0")/../.."
PORT=${PORT:-8379}
CANTAL_PORT=${CANTAL_PORT:-22682}
DIR=${CLUSTER_DIR:-target/cluster}
N=${N:-3}

# `stop NAME`: SIGTERM to the node's process, named by its pid file, after checking that the
# pid is still that node's verwalter (not a reused pid); waits until it has exited.
if [ "${1:-}" = stop ]; then
    name=${2:-}
    if [ -z "$name" ]; then
        echo "usage: $0 stop NAME (a node under $DIR/, e.g. alpha)" >&2
        exit 2
    fi
    pidfile="$DIR/$name/pid"
    if ! [ -f "$pidfile" ]; then
        echo "$name: no $pidfile: the node is not running (nodes: $(cd "$DIR" 2>/dev/null && ls -d -- */ 2>/dev/null | tr -d / | tr '\n' ' '))" >&2
        exit 1
    fi
    pid=$(cat "$pidfile")
    if ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--hostname $name "; then
        echo "$name: process $pid is gone (stale $pidfile removed)" >&2
        rm -f "$pidfile"
        exit 1
    fi
    kill "$pid"
    while [ -d "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; do
        sleep 0.1
    done
    rm -f "$pidfile"
    echo "$name: stopped (pid $pid)"
    exit 0
fi
if [ $# -gt 0 ]; then
    echo "usage: $0 [stop NAME]" >&2
    exit 2
fi

if [ "$N" -lt 1 ] || [ "$N" -gt 254 ]; then
    echo "N must be between 1 and 254 (one 127.0.0.x address per node)" >&2
    exit 2
fi
if [ "$N" -eq 3 ]; then
    NAMES="alpha beta gamma"
else
    NAMES=$(seq -f 'node-%03g' 1 "$N")
fi
if [ "$N" -le 10 ]; then
    LABELS=${LABELS:-1}
else
    LABELS=${LABELS:-0}
fi

if [ -n "${VERWALTER:-}" ] && [ -n "${FAKE_CANTAL:-}" ]; then
    echo "using $VERWALTER and $FAKE_CANTAL"
else
    # Two builds, so that the double's build does not change the daemon's features: the daemon's
    # is a no-op after `make run` or `make build`, the double's takes seconds.
    echo "building target/release/verwalter (cargo build --release; from nothing about 8 minutes on 2 cores, a no-op after make run)"
    cargo build --release -p verwalter --bin verwalter
    echo "building target/release/fake_cantal, the cantal test double (seconds)"
    cargo build --release -p fake-cantal
    VERWALTER=target/release/verwalter
    FAKE_CANTAL=target/release/fake_cantal
fi
mkdir -p "$DIR"
pids=""
cleanup() {
    trap - EXIT INT TERM
    # shellcheck disable=SC2086
    kill $pids 2>/dev/null || true
    wait 2>/dev/null || true
    rm -f "$DIR"/*/pid "$DIR/cantal.pid"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The port in the first line of `$1` matching the basic regex `$2` followed by `IP:PORT`, once
# the process `$3` has written it (for PORT=0 and CANTAL_PORT=0, where the system picks one).
port_from() {
    while :; do
        port=$(sed -n "s/.*$2[0-9.]*:\([0-9][0-9]*\).*/\1/p" "$1" 2>/dev/null | head -n 1)
        if [ -n "$port" ]; then
            echo "$port"
            return
        fi
        if ! [ -d "/proc/$3" ]; then
            echo "the process writing $1 has exited:" >&2
            cat "$1" >&2
            exit 1
        fi
        sleep 0.1
    done
}

# shellcheck disable=SC2046
"$FAKE_CANTAL" --listen "127.0.0.1:$CANTAL_PORT" \
    $(for name in $NAMES; do echo "$name.local"; done) 2>"$DIR/cantal.log" &
pids="$pids $!"
echo $! >"$DIR/cantal.pid"
if [ "$CANTAL_PORT" = 0 ]; then
    CANTAL_PORT=$(port_from "$DIR/cantal.log" "serving .* on " $!)
fi

n=0
for name in $NAMES; do
    n=$((n + 1))
    node="$DIR/$name"
    mkdir -p "$node"
    rm -rf "$node/config"
    cp -r examples/minimal "$node/config"
    RUST_LOG=${RUST_LOG:-info} "$VERWALTER" run \
        --hostname "$name" --name "$name.local" \
        --host "127.0.0.$n" --port "$PORT" \
        --override-machine-id "$(printf '77985419c732412ea38b94db%08d' "$n")" \
        --config-dir "$node/config" --storage-dir "$node/storage" --log-dir "$node/log" \
        --cantal-url "http://127.0.0.1:$CANTAL_PORT" 2>"$node/verwalter.log" &
    pid=$!
    pids="$pids $pid"
    echo "$pid" >"$node/pid"
    if [ "$PORT" = 0 ]; then
        # Node 1 got a port from the system; the others share it, on their own addresses.
        PORT=$(port_from "$node/verwalter.log" "Listening\. addr=" "$pid")
    fi
    if [ "$LABELS" = 1 ]; then
        # The node's log, each line prefixed with its name; ends when the node does.
        tail -n +1 -F --pid="$pid" "$node/verwalter.log" 2>/dev/null | sed -u "s/^/$name | /" &
        pids="$pids $!"
    fi
    if [ "$N" -le 10 ]; then
        echo "$name: http://127.0.0.$n:$PORT/v1/status.pretty  (log: $node/verwalter.log, pid $pid)"
    fi
done
echo "$N nodes on 127.0.0.1-$N:$PORT (logs: $DIR/<name>/verwalter.log)"
echo "leader: http://127.0.0.1:$PORT/v1/leader-redirect-by-node-name/v1/status.pretty"
echo "  (names resolve only if alpha.local etc. are in /etc/hosts; the status pages above work as they are)"
echo "Edit $DIR/<leader>/config/runtime/... to see a new schedule reach every node."
echo "Stop one node: make cluster-stop NODE=<name> (or $0 stop <name>). Ctrl-C stops all."
wait
