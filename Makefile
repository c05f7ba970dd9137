# The command index. `.ci/run` calls `make ci`.

CARGO ?= cargo
DEMO_ID ?= 0000000000000000000000000000d3e0

.PHONY: all build run cluster fmt fmt-check lint browser-deps test ci sim bench bench-rss

all: build

build:
	$(CARGO) build --release

## Run one node on examples/minimal; API on http://127.0.0.1:8379/
run:
	$(CARGO) run --release -- run --config-dir examples/minimal \
		--storage-dir target/demo/storage --log-dir target/demo/log \
		--override-machine-id $(DEMO_ID)

## Three nodes on 127.0.0.1-3 with the cantal test double (see examples/cluster/run.sh)
cluster:
	examples/cluster/run.sh

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

## Everything CI checks: formatting, lints with warnings denied, all tests.
test: fmt-check lint browser-deps
	$(CARGO) test --all

ci: test

## The election and replication simulation with every seed (the unit tests run a quarter)
sim:
	ELECTION_SIM_SCALE=4 $(CARGO) test --release -p verwalter-controllers --lib election::sim

## Criterion benchmarks (scheduler round) and the idle memory figure.
bench:
	$(CARGO) bench --bench scheduler
	benches/idle_rss.sh

bench-rss:
	benches/idle_rss.sh
