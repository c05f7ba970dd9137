# The command index. `.ci/run` calls `make ci`.

CARGO ?= cargo
DEMO_ID ?= 0000000000000000000000000000d3e0
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
DEB := target/verwalter_$(VERSION)_amd64.deb
RPM := target/verwalter-$(VERSION)-1.x86_64.rpm
# The packaging tools, pinned: `make package` installs these versions when missing.
CARGO_DEB_VERSION := 3.8.0
CARGO_GENERATE_RPM_VERSION := 0.21.1
# The Kubernetes manifest validator (PyPI), pinned: `make k8s-deps` installs it when missing.
KUBERNETES_VALIDATE_VERSION := 1.37.0
# C code in the package build (the vendored Lua) gets Debian's hardening: checked string and
# memory functions, stack protector.
PACKAGE_CFLAGS := -O2 -D_FORTIFY_SOURCE=2 -fstack-protector-strong

.PHONY: all build run cluster cluster-stop fmt fmt-check lint browser-deps prometheus-deps test ci sim sim-fleet sim-fleet-short crash-trials soak fuzz bench bench-rss bench-fleet-rss bench-extender nats-deps etcd-deps bench-graph \
	package package-tools package-files package-deps package-checks check-packages-of test-package \
	wasm-example k8s-deps

all: build

build:
	$(CARGO) build --release

## Run one node on examples/minimal; API on http://127.0.0.1:8379/
run:
	$(CARGO) run --release -- run --config-dir examples/minimal \
		--storage-dir target/demo/storage --log-dir target/demo/log \
		--override-machine-id $(DEMO_ID)

## N nodes (3 by default: make cluster N=100) on 127.0.0.1-N with the cantal test double
## (see examples/cluster/run.sh)
N ?= 3
cluster:
	N=$(N) examples/cluster/run.sh

## Three data centers (ams, fra, lon) of NODES nodes each (1 by default: make multi-dc NODES=3)
## on 127.0.0.111-139, lending workers to each other (see examples/multi-dc/README.md)
NODES ?= 1
.PHONY: multi-dc
multi-dc:
	NODES=$(NODES) examples/multi-dc/run.sh

## Stop one node of `make cluster`: make cluster-stop NODE=alpha (by its pid file)
cluster-stop:
	@if [ -z "$(NODE)" ]; then echo "usage: make cluster-stop NODE=<name, e.g. alpha>" >&2; exit 2; fi
	@examples/cluster/run.sh stop "$(NODE)"

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Debian's chromium and chromium-driver for the browser tests: installed when missing and this
## runs as root with apt-get; otherwise a hint (the browser tests then fail saying the same).
browser-deps:
	@if { [ -z "$$CHROMEDRIVER" ] && ! command -v chromedriver >/dev/null; } || \
	    { [ -z "$$CHROMIUM" ] && ! [ -x /usr/bin/chromium ] && ! command -v chromium >/dev/null; }; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	    else \
	        echo "browser tests need chromium and chromedriver: apt-get install chromium chromium-driver (or set CHROMIUM and CHROMEDRIVER)" >&2; \
	    fi; \
	fi

## Debian's prometheus for the placement data-source test against a real Prometheus
## (tests/sources.rs): installed when missing and this runs as root with apt-get; otherwise a hint
## (the test then skips loudly, or fails under CI).
prometheus-deps:
	@if [ -z "$$PROMETHEUS" ] && ! [ -x /usr/bin/prometheus ] && ! command -v prometheus >/dev/null; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	    else \
	        echo "the placement source test needs prometheus: apt-get install prometheus (or set PROMETHEUS)" >&2; \
	    fi; \
	fi

## Debian's nats-server for the graph executor's tests against a real NATS (tests/graph_nats.rs):
## installed when missing and this runs as root with apt-get; otherwise a hint (the tests then
## fail saying the same).
nats-deps:
	@if [ -z "$$NATS_SERVER" ] && ! [ -x /usr/bin/nats-server ] && ! command -v nats-server >/dev/null; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nats-server; \
	    else \
	        echo "the graph executor tests need nats-server: apt-get install nats-server (or set NATS_SERVER)" >&2; \
	    fi; \
	fi

## Debian's etcd-server (and etcd-client for etcdctl) for the tests against a real etcd
## (tests/etcd.rs), and protobuf-compiler, whose protoc the `etcd` feature's client needs at build
## time: installed when missing and this runs as root with apt-get; otherwise a hint (the etcd
## tests then fail under CI saying the same).
etcd-deps:
	@if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null || ! command -v protoc >/dev/null || ! [ -f /usr/include/google/protobuf/descriptor.proto ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server etcd-client protobuf-compiler libprotobuf-dev; \
	    else \
	        echo "the etcd backend's build and tests need protoc, etcd and etcdctl: apt-get install protobuf-compiler libprotobuf-dev etcd-server etcd-client" >&2; \
	    fi; \
	fi

## The graph executor's dispatch overhead: 1,000-component builds through a real nats-server
## with an instant worker (docs/benchmarks.md).
bench-graph: nats-deps
	$(CARGO) test --release --test tests graph_nats::bench -- --ignored --nocapture --test-threads 1

## Everything CI checks: formatting, lints with warnings denied, all tests, the packages, in
## timed stages (tests/stages.sh; the stage times are printed at the end).
test:
	CARGO="$(CARGO)" MAKE="$(MAKE)" PACKAGE_CFLAGS="$(PACKAGE_CFLAGS)" \
	    DEB_NAME=$(notdir $(DEB)) RPM_NAME=$(notdir $(RPM)) tests/stages.sh

ci: test

## PyPI's kubernetes-validate at the pinned version for the manifest test (tests/kubernetes.rs),
## installed with pip when missing or another version; make-tls.sh's openssl with apt-get as
## root (the tests fail under CI without them, else skip saying so).
k8s-deps:
	@if [ "$$(python3 -m kubernetes_validate --version 2>/dev/null)" != "$(KUBERNETES_VALIDATE_VERSION)" ]; then \
	    python3 -m pip install --quiet kubernetes-validate==$(KUBERNETES_VALIDATE_VERSION) 2>/dev/null || \
	    python3 -m pip install --quiet --break-system-packages kubernetes-validate==$(KUBERNETES_VALIDATE_VERSION); \
	fi
	@if ! command -v openssl >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl; \
	fi

## The election and replication simulation with every seed (the unit tests run a quarter)
sim:
	ELECTION_SIM_SCALE=4 $(CARGO) test --release -p verwalter-controllers --lib election::sim

## The election simulation at fleet size (1,000 nodes: chaos, then leader crashes), `#[ignore]`d
## in the unit tests: 5 seeds of each (make test, in the debug build), or 1,000 seeds of each
## with figures.
sim-fleet-short:
	ELECTION_SIM_SCALE=0 $(CARGO) test -p verwalter-controllers --lib -- election::sim::tests::fleet --ignored

sim-fleet:
	ELECTION_SIM_SCALE=4 $(CARGO) test --release -p verwalter-controllers --lib -- election::sim::tests::fleet --ignored --nocapture

## Crash trials: 1,000 SIGKILLs of the daemon at random moments (make test runs 10).
crash-trials:
	CRASH_TRIALS=1000 $(CARGO) test --test tests crash -- --nocapture

## Soak: five nodes under churn for an hour (make test runs 3 minutes).
soak:
	SOAK_SECS=3600 $(CARGO) test --release --test tests soak -- --nocapture
## The long fuzz run (docs/reliability.md, "Fuzzing"): every parser and decoder for FUZZ_SECS
## seconds each, built with the `fuzz` profile (release with overflow checks) (FUZZ_TARGETS=a,b
## for some; FUZZ_SEED; FUZZ_SAVE=1 keeps new corpus entries under target/fuzz-out/new-corpus/);
## crashing inputs go to target/fuzz-out/crashes/.
## `make test` runs the short version (the corpus and 2,000 inputs per target).
FUZZ_SECS ?= 60
fuzz:
	FUZZ_SECS=$(FUZZ_SECS) $(CARGO) test --profile fuzz --test tests fuzz::long_run -- \
	    --ignored --exact --nocapture

## Rebuilds the shipped WebAssembly examples from their Rust source: the scheduler of
## examples/wasm-scheduler and the query.wasm of examples/wasm-query; needs the wasm32 target
## (`rustup target add wasm32-unknown-unknown`). The tests use the shipped modules, so CI does not
## run this.
WASM_EXAMPLE := examples/wasm-scheduler
WASM_QUERY_EXAMPLE := examples/wasm-query
wasm-example:
	cd $(WASM_EXAMPLE) && $(CARGO) build --release --target wasm32-unknown-unknown
	cp $(WASM_EXAMPLE)/target/wasm32-unknown-unknown/release/verwalter_wasm_scheduler.wasm \
	    $(WASM_EXAMPLE)/scheduler/v1/scheduler.wasm
	cd $(WASM_QUERY_EXAMPLE) && $(CARGO) build --release --target wasm32-unknown-unknown
	cp $(WASM_QUERY_EXAMPLE)/target/wasm32-unknown-unknown/release/verwalter_wasm_query.wasm \
	    $(WASM_QUERY_EXAMPLE)/scheduler/v1/query.wasm

## Criterion benchmarks (scheduler round), the wasm scheduler against its Lua twin, and the idle
## memory figure.
bench:
	$(CARGO) bench --bench scheduler
	$(CARGO) bench --bench wasm
	benches/idle_rss.sh

bench-rss:
	benches/idle_rss.sh

## Resident memory with 1,000 peers and 500 roles (issue 15).
bench-fleet-rss:
	benches/fleet_rss.sh

## The scheduler extender: the decision for 5,000 NodeNames (criterion), then wrk against the
## real server on one core (installs Debian's wrk when missing, as root).
bench-extender:
	$(CARGO) bench -p verwalter-placement --bench extender
	benches/extender.sh

## cargo-deb and cargo-generate-rpm, installed with `cargo install --locked` when missing.
package-tools:
	@command -v cargo-deb >/dev/null || \
	    $(CARGO) install --locked cargo-deb --version $(CARGO_DEB_VERSION)
	@command -v cargo-generate-rpm >/dev/null || \
	    $(CARGO) install --locked cargo-generate-rpm --version $(CARGO_GENERATE_RPM_VERSION)

## The .deb and the .rpm under target/ (docs/packaging.md), of the shipped build.
package: package-tools
	CFLAGS="$(PACKAGE_CFLAGS)" $(CARGO) build --profile dist --locked --bin verwalter
	$(MAKE) package-files PKG_BIN=target/dist/verwalter

## The .deb and the .rpm (DEB, RPM) of the binary PKG_BIN (`make test` packages the tests'
## debug build, with PKG_FAST=1 for quicker compression). target/pkg/ holds what both take: the
## stripped binary, the man pages and the completions made from it.
PKG_BIN ?= target/dist/verwalter
PKG_FAST ?=
package-files:
	rm -rf target/pkg
	mkdir -p target/pkg/man target/pkg/completions $(dir $(DEB)) $(dir $(RPM))
	strip --strip-all --remove-section=.comment --remove-section=.note \
	    -o target/pkg/verwalter $(PKG_BIN)
	target/pkg/verwalter generate man target/pkg/man
	gzip -9n target/pkg/man/*.1
	target/pkg/verwalter generate completions bash > target/pkg/completions/verwalter
	target/pkg/verwalter generate completions zsh > target/pkg/completions/_verwalter
	target/pkg/verwalter generate completions fish > target/pkg/completions/verwalter.fish
	$(CARGO) deb --no-build --locked -p verwalter -o $(DEB) $(if $(PKG_FAST),--fast)
	$(CARGO) generate-rpm -p . -o $(RPM) $(if $(PKG_FAST),--payload-compress gzip)
	@ls -l $(DEB) $(RPM) target/pkg/verwalter

## What the package checks use (lintian, rpmlint, rpm, dpkg-shlibdeps, systemd-analyze, man):
## installed when missing and this runs as root with apt-get; otherwise the checks say what
## is missing and are skipped.
package-deps:
	@need=""; \
	for pair in lintian:lintian rpmlint:rpmlint rpm:rpm dpkg-shlibdeps:dpkg-dev \
	        systemd-analyze:systemd man:man-db strip:binutils; do \
	    command -v $${pair%%:*} >/dev/null || need="$$need $${pair#*:}"; \
	done; \
	if [ -n "$$need" ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need; \
	    else \
	        echo "the package checks need:$$need (apt-get install$$need)" >&2; \
	    fi; \
	fi

## Builds both packages, then checks them (tests/package.rs): lintian, rpmlint, their contents,
## and, as root on Debian, installs the .deb, runs it and purges it.
test-package: package
	$(MAKE) package-checks

## The package checks on DEB and RPM as they are (LINTIAN_SUPPRESS: tags lintian may not fail on;
## TEST_FEATURES: the cargo features the test binary was built with, so that it is not built again).
LINTIAN_SUPPRESS ?=
TEST_FEATURES ?=
package-checks:
	VERWALTER_DEB=$(DEB) VERWALTER_RPM=$(RPM) VERWALTER_LINTIAN_SUPPRESS=$(LINTIAN_SUPPRESS) \
	    $(CARGO) test --locked $(TEST_FEATURES) --test tests package:: -- --ignored --test-threads=1

## Packages of PKG_BIN, then their checks (the package stage of `make test`).
check-packages-of:
	$(MAKE) package-tools
	$(MAKE) package-files
	$(MAKE) package-checks
