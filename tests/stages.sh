#!/usr/bin/env bash
# `make test`: every check CI makes, in timed stages, with a table of the stage times at the end
# (docs/benchmarks.md, "The test command"). Run from the Makefile (`make test`); the stages:
#
#   tools     what the tests use, installed when missing (the Makefile's *-deps targets; the
#             packaging tools in the background beside the tests, as `package-tools`)
#   fmt       cargo fmt --check
#   build     every target of the workspace built once for the tests, with clippy's lints
#             denied on the workspace's crates (clippy-driver as the workspace's rustc wrapper:
#             what `cargo clippy -- -D warnings` checks, without a second pass over every
#             dependency in check mode)
#   soak      tests/soak.rs, in the background from the end of the build: a paced load of
#             SOAK_SECS (180 s) that runs beside the stages below
#   sim       the election simulation at fleet size, 5 seeds of each scenario (`make sim-fleet`
#             runs 1,000 in release), in the background as well
#   tests     unit, integration and browser tests (TEST_THREADS at once, 6 by default: most of
#             them wait on daemons, not on the CPU)
#   package   the .deb and the .rpm made from the tests' binary (stripped), then checked by
#             tests/package.rs: lintian, rpmlint, contents, installed, run and purged (`make
#             package` builds the shipped binary, fat LTO, and `make test-package` checks that).
#             lintian finds the debug build's C calls unfortified, so that one tag is
#             suppressed here, and only here
#
# A failing stage does not stop the later ones (but a failed build stops all); the exit status
# is non-zero when any failed. The build goes to target/make-test/ (CARGO_TARGET_DIR), the
# background stages' logs to target/test-stages/.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
MAKE=${MAKE:-make}
THREADS=${TEST_THREADS:-6}
# The tests are built with the etcd backend (docs/etcd.md), which `cargo build` leaves out.
FEATURES=(--features verwalter/etcd)
SOAK_SECS=${SOAK_SECS:-180}
logs=target/test-stages
mkdir -p "$logs"

# Its own target dir, so that `make test` and a contributor's `cargo test` (built without the
# wrapper and C flags below) do not rebuild each other's artifacts.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/make-test}
# Line tables are what the tests' panics and backtraces use; full debug info made the build
# slower (docs/benchmarks.md, "The test command").
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
# The C code (the vendored Lua) hardened as in the packages, which lintian checks.
export CFLAGS=${PACKAGE_CFLAGS:?run by make test, which sets PACKAGE_CFLAGS}
# What the package stage names its files (the Makefile's DEB and RPM).
deb=${DEB_NAME:?run by make test}
rpm=${RPM_NAME:?run by make test}

# Every cargo command below sees the same wrapper, so none rebuilds what the build stage built.
if ! clippy_driver=$(rustup which clippy-driver 2>/dev/null); then
    clippy_driver=$(command -v clippy-driver) || {
        echo "make test needs clippy (rustup component add clippy)" >&2
        exit 1
    }
fi
export RUSTC_WORKSPACE_WRAPPER=$clippy_driver
# clippy-driver's arguments, as `cargo clippy -- -D warnings` hands them over.
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

names=()
secs=()
states=()
failed=0
began=$(date +%s%N)

tenths() { # the time from $1 to $2 (default: now), nanoseconds, as seconds with one decimal
    local t=$(( (${2:-$(date +%s%N)} - $1) / 100000000 ))
    echo "$(( t / 10 )).$(( t % 10 ))"
}

record() { # name, start (ns), status
    names+=("$1")
    secs+=("$(tenths "$2")")
    if [ "$3" = 0 ]; then states+=(ok); else states+=(FAILED); failed=1; fi
}

stage() { # name, command...
    local name=$1 start rc
    shift
    echo "==> stage $name: $*"
    start=$(date +%s%N)
    "$@"
    rc=$?
    record "$name" "$start" "$rc"
    return "$rc"
}

summary() {
    echo
    echo "stage times (s):"
    local i
    for i in "${!names[@]}"; do
        printf '  %-13s %6s  %s\n' "${names[$i]}" "${secs[$i]}" "${states[$i]}"
    done
    printf '  %-13s %6s\n' total "$(tenths "$began")"
}

stage tools "$MAKE" -s browser-deps prometheus-deps package-deps nats-deps etcd-deps k8s-deps
stage fmt "$CARGO" fmt --all -- --check
if ! stage build "$CARGO" test --workspace --all-targets --locked "${FEATURES[@]}" --no-run; then
    summary
    exit 1
fi

declare -A pids
# Stages in the background beside the tests: the soak, a paced load that mostly waits, and
# the fleet simulation (its seeds on both cores). Each writes its log, its exit status and its
# end time under $logs.
background() { # name, command...
    local name=$1
    shift
    echo "==> stage $name (background): $* > $logs/$name.log"
    rm -f "$logs/$name.end"
    (
        start=$(date +%s%N)
        "$@" >"$logs/$name.log" 2>&1
        echo "$? $start $(date +%s%N)" >"$logs/$name.end"
    ) &
    pids[$name]=$!
}

join() { # name: waits for the background stage, records it, shows its result lines
    local name=$1 rc start end
    wait "${pids[$name]}"
    read -r rc start end <"$logs/$name.end"
    names+=("$name")
    secs+=("$(tenths "$start" "$end")")
    if [ "$rc" = 0 ]; then
        states+=(ok)
        grep -E '^(test |test result:)' "$logs/$name.log"
    else
        states+=(FAILED)
        failed=1
        cat "$logs/$name.log"
    fi
}

# The packaging tools (`cargo install`, about 3.5 minutes of compiling when missing) are built
# beside the tests too: only the package stage needs them.
background package-tools "$MAKE" -s package-tools
background soak env SOAK_SECS="$SOAK_SECS" "$CARGO" test --locked "${FEATURES[@]}" --test tests soak:: -- --nocapture
background sim env ELECTION_SIM_SCALE=0 "$CARGO" test --workspace --locked "${FEATURES[@]}" --lib -- \
    election::sim::tests::fleet --ignored

stage tests "$CARGO" test --workspace --locked "${FEATURES[@]}" --no-fail-fast -- --skip soak:: \
    --test-threads "$THREADS"
echo "==> waiting for the packaging tools"
join package-tools
stage package "$MAKE" -s check-packages-of PKG_BIN="$CARGO_TARGET_DIR/debug/verwalter" \
    DEB="$CARGO_TARGET_DIR/pkg/$deb" RPM="$CARGO_TARGET_DIR/pkg/$rpm" PKG_FAST=1 \
    LINTIAN_SUPPRESS=hardening-no-fortify-functions TEST_FEATURES="${FEATURES[*]}"

echo "==> waiting for the background stages"
join soak
join sim

summary
exit "$failed"
