#!/usr/bin/env bash
# `make test`: every check CI makes, in timed stages, with a table of the stage times at the end
# (docs/benchmarks.md, "The test command"). Run from the Makefile (`make test`); the stages:
#
#   tools     what the tests use, installed when missing (the Makefile's *-deps targets)
#   fmt       cargo fmt --check
#   build     every target of the workspace built once for the tests, with clippy's lints
#             denied on the workspace's crates (clippy-driver as the workspace's rustc wrapper:
#             what `cargo clippy -- -D warnings` checks, without a second pass over every
#             dependency in check mode)
#   soak      tests/soak.rs, started in the background right after the build: a paced load of
#             SOAK_SECS (180 s) that runs beside the stages below
#   tests     unit, integration and browser tests (TEST_THREADS at once, 6 by default: most of
#             them wait on daemons, not on the CPU)
#   sim       the election simulation at fleet size, 5 seeds of each scenario (`make sim-fleet`
#             runs 1,000 in release)
#   package   the .deb and the .rpm made from the tests' binary (stripped), then checked by
#             tests/package.rs: lintian, rpmlint, contents, installed, run and purged (`make
#             package` builds the shipped binary, fat LTO, and `make test-package` checks that).
#             lintian finds the debug build's C calls unfortified, so that one tag is
#             suppressed here, and only here
#
# A failing stage does not stop the later ones (but a failed build stops all); the exit status
# is non-zero when any failed. The build goes to target/make-test/ (CARGO_TARGET_DIR), the background soak's log to
# target/test-stages/soak.log.
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
MAKE=${MAKE:-make}
THREADS=${TEST_THREADS:-6}
SOAK_SECS=${SOAK_SECS:-180}
logs=target/test-stages
mkdir -p "$logs"

# Its own target dir, so that `make test` and a contributor's `cargo test` (built without the
# wrapper and C flags below) do not rebuild each other's artifacts.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/make-test}
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

tenths() { # nanoseconds since $1, as seconds with one decimal
    local t=$(( ($(date +%s%N) - $1) / 100000000 ))
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
        printf '  %-8s %6s  %s\n' "${names[$i]}" "${secs[$i]}" "${states[$i]}"
    done
    printf '  %-8s %6s\n' total "$(tenths "$began")"
}

stage tools "$MAKE" -s browser-deps prometheus-deps package-deps nats-deps k8s-deps package-tools
stage fmt "$CARGO" fmt --all -- --check
if ! stage build "$CARGO" test --workspace --all-targets --locked --no-run; then
    summary
    exit 1
fi

echo "==> stage soak (background, ${SOAK_SECS} s): log in $logs/soak.log"
soak_start=$(date +%s%N)
SOAK_SECS=$SOAK_SECS "$CARGO" test --locked --test tests soak:: -- --nocapture >"$logs/soak.log" 2>&1 &
soak_pid=$!

stage tests "$CARGO" test --workspace --locked --no-fail-fast -- --skip soak:: \
    --test-threads "$THREADS"
stage sim env ELECTION_SIM_SCALE=0 "$CARGO" test --workspace --locked --lib -- \
    election::sim::tests::fleet --ignored
stage package "$MAKE" -s check-packages-of PKG_BIN="$CARGO_TARGET_DIR/debug/verwalter" \
    DEB="$CARGO_TARGET_DIR/pkg/$deb" RPM="$CARGO_TARGET_DIR/pkg/$rpm" PKG_FAST=1 \
    LINTIAN_SUPPRESS=hardening-no-fortify-functions

echo "==> waiting for the soak"
wait "$soak_pid"
soak_rc=$?
record soak "$soak_start" "$soak_rc"
# Its result line (and, when it failed, the whole log) for the reader and for .ci/run's count.
if [ "$soak_rc" = 0 ]; then grep -E '^(test |test result:)' "$logs/soak.log"; else cat "$logs/soak.log"; fi

summary
exit "$failed"
