//! Integration tests: the built `verwalter` binary, run the way users run it.
//!
//! Two rules keep them fast and free of flakes on a loaded 2-core machine:
//! - **Wait on what the daemon reports** (a log line, a status field, a metric, an epoch), never
//!   on a sleep; "nothing happened" is proven by an event that must come after it (e.g. the
//!   render passes that looked at a new schedule, the id of an action sent later).
//! - **No port picked by bind-and-release**: daemons run with `--port 0` and the test reads the
//!   port from their `Listening.` line (`util::Daemon::launch`); chromedriver and the cantal test
//!   double pick theirs the same way; a cluster's nodes share the port node 1 was given.
//!
//! Index:
//! - `actions`: the action API on a single node: answers, 204, request errors, the audit line,
//!   pending actions across a restart, acknowledged actions surviving kill -9, the pending cap;
//!   no id given twice across a kill -9 within the same second (a slowed wall clock, preloaded).
//! - `cli`: `verwalter check` (symlink loops and links out, big and deep files; dependency cycles,
//!   missing dependencies and unresolvable references with the daemon's messages), `verwalter
//!   schedule` (the example scheduler's instances dealt out over the nodes), `verwalter render`
//!   (references resolved as the daemon does), `--version`, bad settings; the offline commands
//!   of the README and the examples' READMEs run as written; the README's tour, command by
//!   command, against a node started as `make run` starts it.
//! - `cluster`: three processes on 127.0.0.1–3 with the cantal test double: one leader, one
//!   schedule everywhere, forged election packets dropped, failover after SIGKILL of the leader;
//!   a follower rendering and logging a big shared role as its leader does;
//!   `examples/cluster/run.sh` (`make cluster`) itself: labelled log lines, pid files,
//!   `make cluster-stop NODE=...`.
//! - `crash`: crash trials: SIGKILL at random moments (chosen by the number of role applies
//!   seen) while schedules change; every rendered file whole, the stored schedule whole, no
//!   schedule lost, every role converged after the restart (`CRASH_TRIALS`, `CRASH_SEED`); kills
//!   in a stream of rounds, right after a schedule is logged as taken: the start loads it or the
//!   one before (the schedule slots), never another.
//! - `daemon`: a single node on a temp copy of `examples/minimal`: schedule over HTTP, edits
//!   picked up without a restart, a broken scheduler shown in `/v1/status` with the old schedule
//!   kept, the schedule persisted across a restart, clean exit on SIGTERM; out of descriptors
//!   (`prlimit`), a failed read keeps the last good inputs and is shown; idle connections past
//!   the cap under a low descriptor limit cannot starve the API, nor can request bodies that
//!   never come (408); runtime links that lead round to each other left out with the rest
//!   scheduled; a symlink as the stored schedule replaced, never read or written through, and
//!   a FIFO there not blocking the start.
//! - `datacenters`: two data centers of two nodes on 127.0.0.41–44 (docs/datacenters.md), the
//!   DCs from the settings file and the flag: a leader in each, `/v1/peers` only the own DC's,
//!   no election packet from the other DC after twenty received, a follower's `409` naming its
//!   leader; `POST /v1/dc/exchange` on a leader: unsigned or forged `403` (changing nothing),
//!   too big `413`, from outside the mesh or its own DC `403`, a member's taken with a signed
//!   answer, its replay `409`; two one-node DCs behind delaying proxies (`datacenters.advertise`):
//!   both links up (shown by `/v1/datacenters`, GraphQL's `datacenters` and the `verwalter_dc_*`
//!   metrics), down when the
//!   proxies cut, up again after the heal; refusals counted by reason; two one-node DCs running
//!   `examples/multi-dc`'s scheduler: each DC's summary in the other's `/v1/scheduler_input`
//!   (`datacenters`), a request answered by the lender's scheduler in the borrower's schedule;
//!   three DCs of three nodes on 127.0.0.51–59 running the same scheduler, each node reached by
//!   the other DCs through its own proxy (40–200 ms round trips): the grant in every borrowing
//!   node's schedule, expired on its lease after the lender–borrower link is cut (the third DC
//!   still up with both), back after the heal, no election packet across DCs; `make multi-dc`
//!   (`examples/multi-dc/run.sh`) on 127.0.0.111/121/131: the URLs printed, a grant, a demand
//!   edit moving the borrowing to another DC.
//! - `dc_proxy`: the delaying, cutting TCP proxy of the multi-DC tests (`DcProxy`): a daemon's
//!   API through it, an open connection shut down by a cut, new ones refused until the heal; a
//!   round trip through it at least twice its delay.
//! - `etcd` (with the `etcd` feature): leadership on a real 3-member etcd (Debian's, on
//!   127.0.0.61–113) with five nodes: one leader and its schedule everywhere, an etcd member killed
//!   changing nothing, failover after SIGKILL of the leader, the leader cut off
//!   from etcd (its proxies cut) stepping down before another leads and every schedule in etcd's
//!   history written by the leadership holding the key, a schedule key written by a non-leader
//!   (wrong lease) ignored by the followers, a leader stopped with SIGTERM resigning and revoking
//!   its lease; the ignored `bench_failover` (etcd with a 2 s lease,
//!   the built-in election and `etcdctl lock --ttl 2`: docs/benchmarks.md).
//! - `etcd_move` (with the `etcd` feature): five nodes moved from the built-in election to a real
//!   etcd (on 127.0.0.141–143) and back by rolling restarts (docs/etcd.md, "Moving between
//!   backends"): at every look at most one leader and a schedule on every node; a moved node
//!   deferring to the built-in leader while a majority elects it and following its new schedule,
//!   etcd electing once the majority moved; an untagged ping dropped by the etcd leader (the
//!   election key); the etcd leader resigning at the built-in leader's ping and following it;
//!   a node back on etcd refusing the stale `P/schedule` and following the built-in leader.
//! - `extender`: `verwalter extender` with recorded kube-scheduler requests
//!   (`fixtures/extender/`): replies byte-checked, the in-band `Error` and `/readyz` 503 (with
//!   the file's problem) until a snapshot file is good, reloads and a bad file keeping the last good, namespaces, `/metrics`, `/status`, start
//!   errors, and the daemon serving it by its settings (with its limits); wca's `loggers:`
//!   setting the log filter (decisions logged with their reasons, an unknown logger refused),
//!   plain HTTP to its TLS port logged with the peer, a source failing before any data saying
//!   nothing is loaded; hostile clients:
//!   bodies trickled or idle keep-alive connections at the cap make room for a real request, an
//!   oversized `Content-Length` gets 413 at once, a trickled body 408, bodies together within
//!   the byte budget (503 past it).
//! - `graph_nats`: `verwalter graph` against Debian's `nats-server` (`make nats-deps`) with a
//!   worker in the test: the example service build in dependency order with references resolved
//!   and one result, an error while others run (one `.error`, after them), a lost answer timed
//!   out, SIGKILL and resume without re-dispatch, a NATS restart, the daemon by its `graph:`
//!   settings with its metrics, the example's delete build, the daemon's deployment events
//!   on NATS (each role's as it finishes, with its time), a result over the server's max_payload
//!   published as a summary, a password in the NATS URL used and never logged (at debug too);
//!   upstream ernest's `scheduler_test.go` cases from `tests/data/ernest/scheduler.json`,
//!   ernest's import fixture dispatching its finds, a `_provider` taken from a component and the
//!   result's ernest fields, `--templating extended`, a build without `_provider` failing at once
//!   (and one with whitespace at dispatch); the ignored `bench_thousand_components` (`make
//!   bench-graph`).
//! - `graph_nats::delivery`, with `nats-server -js` and a deduplicating stream: a kill between
//!   storing a result and publishing it, or before marking it sent, then a restart (one result in
//!   the stream, at least one on core NATS, one `Nats-Msg-Id`); crash trials, kill -9 at random
//!   moments (`GRAPH_CRASH_TRIALS`, `GRAPH_CRASH_SEED`): every build ends with a result, no
//!   component dispatched twice; two executors on one server run each build once.
//! - `graph_prod`: `verwalter graph` on a production NATS server: TLS with a CA and a client
//!   certificate (rcgen), a user and password, a token and an NKey from files, a wrong CA,
//!   password or seed named in the error (never logged), the daemon's `graph.nats-*` and
//!   `deployment-events.nats-*` settings; `graph builds list|show|prune` on a real run's files,
//!   `--retention 0s` removing a finished build and keeping a running one, the per-component
//!   log lines.
//! - `graphql`: `/v1/graphql` on the daemon: a query agreeing with `/v1/status`, a parse error's
//!   400, and a `graphql-ws` subscription that reports the schedule made from an edit.
//! - `frontend`: the built-in web frontend in headless Chromium: live status, buttons, logs, a
//!   follower, failures shown with their cause, every page without a script error under its
//!   Content-Security-Policy (which refuses an inline script and framing); its modules served
//!   as JavaScript; the GraphQL page (`/v1/graphiql`) under the frontend's header, its schema
//!   explorer and field completion, querying and subscribing with the API token; the Shadow
//!   page with each shadow's latest result, diff and history, and a shadow render of a role
//!   from a differing shadow's schedule with its file diff; the Data centers page against two
//!   one-node DCs: the link up with its RTT and traffic, another DC's signed request with its
//!   time left, the link down live once the other DC stops with the failed exchange's cause (also in
//!   `/v1/datacenters` and GraphQL); a DC without the key (the exchange
//!   off) and a node in no DC (how to set one).
//! - `hostile`: hostile clients at once (events streams that never read while the status
//!   changes, half requests, huge and malformed bodies, more connections than the cap):
//!   `/v1/status` keeps answering, they are closed, memory stays under the stated bound; and
//!   GraphQL ones (huge, malformed, too deep and too wide bodies; sockets and subscriptions past
//!   their caps; a subscriber that never reads; fragments that each spread the next twice, over
//!   POST and the WebSocket), refused or dropped as `docs/http-api.md` says.
//! - `fuzz`: the fuzz harness (`fuzz/engine.rs`, a mutational fuzzer on stable Rust) over every
//!   parser and decoder (`fuzz/targets.rs`), each from its corpus `fuzz/corpus/<target>/`: the
//!   corpus and 2,000 mutated inputs per target here, `make fuzz` for the long run; the crashes
//!   it found, one test each (`fuzz/regressions.rs`). Calls the parsers in-process, not the
//!   binary.
//! - `kubernetes`: `deploy/kubernetes/` as docs/placement.md's "On Kubernetes" applies it:
//!   every manifest validated by the pinned `kubernetes-validate --strict` (`make k8s-deps`) and
//!   kube-scheduler's configuration by its v1 fields; the objects wired to each other (account
//!   and rights, labels, ports, probes, mounts, the Service's address and DNS name in
//!   kube-scheduler's configuration); and the extender started with the Deployment's args and
//!   env and the ConfigMap's config against the Kubernetes API double and a real Prometheus,
//!   `/readyz` 503 while the API's first answer is held and 200 after, then `/filter` and
//!   `/prioritize` over TLS checked against `make-tls.sh`'s CA for the configured serverName.
//! - `lithos`: `examples/lithos` with the stand-in `lithos_switch`: both roles switched, a new
//!   version switches only its role, a config lithos would refuse fails that role until fixed.
//! - `mixed`: one node beside a test double of a verwalter 0.13 node (0.13's election packets,
//!   0.13's fetch rule: only on a changed stamp, only once following): the double takes the
//!   schedule of each leadership, also of a leader re-elected or restarted with unchanged data.
//! - `notify`: under a stand-in for systemd (a datagram socket as `NOTIFY_SOCKET`,
//!   `WATCHDOG_USEC`): `READY=1`, the status line, periodic pings (also without `WATCHDOG_PID`),
//!   a stuck render pass that stops them, `STOPPING=1`, apply commands without the variables;
//!   exit status 3 with one line of cause for bad settings, a port in use, a storage dir that is
//!   not one, an action journal that is a FIFO or a link.
//! - `package`: the packaged settings file loads, shows the real defaults, agrees with the unit,
//!   and is no input at the top of the config dir (an edit changes nothing); the rest runs on
//!   the packages `make test-package` (and `make test`'s package stage) builds: lintian and
//!   rpmlint clean, metadata and contents (`dpkg-deb`, `rpm -qp`), the .rpm in a scratch root (`rpm -V`), the .deb installed as root
//!   (`--version`, `check`, `man -w`, the dirs it makes, `systemd-analyze verify` with empty
//!   stderr) and purged.
//! - `partition`: five nodes behind forwarding proxies the test cuts (the wiring; the rules are
//!   simulated in controllers): a leader cut off into a minority steps down and the minority
//!   elects nobody; in minority mode both sides lead and the healed leader merges both.
//! - `placement_cli`: `verwalter placement simulate` on `examples/placement` (wca's experiment):
//!   the table in the config's order, JSON twice byte for byte with the Fit family at 0 % broken
//!   nodes and NOP above, the SVG chart naming every algorithm, `--algorithm`, and bad node and
//!   task files refused with file and line; inputs over the limits (a device, a FIFO, a file
//!   over 16 MiB, counts of nodes or tasks) refused, named; the chart read back from its SVG:
//!   legend box right of the plot, colours apart for colour-blind vision, the subtitle naming
//!   the sets, no empty slot right of the balance bars, sparse minor grid lines.
//! - `layout`: docs/ARCHITECTURE.md's module tables name every source file of the three crates,
//!   and every file they name exists.
//! - `render`: rendering and applying roles: only changed roles re-render, force_render_all,
//!   a failing role retried until it recovers, hostile schedules, atomic file replacement, a
//!   restart with a stored schedule renders without a 'template dir missing' error, role
//!   names literal in `!CleanFiles` patterns, roles applied while the deployment log is unwritable,
//!   a role with 1 MiB of variables logging only what changed (bytes per change, not the megabyte);
//!   `depends_on` (docs/graphs.md's example run as written, read from the doc; held-back roles
//!   on the Overview and a role page's root cause in headless Chromium).
//! - `scheduler_metrics`: `state.metrics` from `scheduler/v1/metrics.yaml` against a Prometheus
//!   test double: a scheduler writes what it sees into the schedule (values, age, a new value
//!   re-running it, a failing Prometheus keeping the last answer with its error, a bad file
//!   shown with its line while the last good declaration goes on); the offline `verwalter
//!   schedule` with and without `--no-metrics`.
//! - `shadow`: shadow schedulers on `examples/minimal` (a copy of `v1`, one adding a key, a
//!   failing, a looping and a memory-hungry one): each real round has a run of each shadow on
//!   its input hash, the diff in the API (empty for the copy), failures recorded with their kind
//!   and the real schedule untouched, rounds going on; a shadow still running skipped for the
//!   next round (recorded) while that round is published; problems of `shadow.yaml` named; the
//!   metrics; GraphQL's `shadows`; `verwalter shadow diff` and `promote` (on a running
//!   daemon); wasm shadows (a copy of v1's module, a trapping one); runs kept across a
//!   restart (docs/scheduler.md's example file); its `shadow diff` sample checked against real
//!   output and its `promote` example run as written; a shadow's answers to actions kept in its
//!   runs, never sent to `/v1/wait_action`; a shadow never reaching a follower (two nodes).
//! - `shadow_render`: a shadow render of a role with a changed template (issue 34): over the API of
//!   a running node, the file diff, no command run, the role's applied hash, staging file and
//!   deployment log untouched, the scratch dir gone, refusals; from a shadow scheduler's latest
//!   output (`{"shadow": name}`: a changed role variable, with a candidate template too, errors
//!   named); `verwalter render --shadow` and `--shadow-schedule` (docs/rendering.md's example run
//!   as written) and its older examples (the dry run's output, hand-written variables).
//! - `soak`: five nodes under churn for `SOAK_SECS` (180 s; `make soak`: an hour): a
//!   schedule change a second, actions, three events readers, a flapping node; RSS, descriptors
//!   and logs of the steady nodes stay flat, and the cluster converges at the end.
//! - `sources`: the placement data sources against test doubles of the Kubernetes API (HTTPS
//!   with a test CA and a bearer token; plain HTTP as `kubectl proxy`) and of Prometheus: the
//!   snapshot as wca reads it, a pod bound by kube-scheduler counted from the watch before the
//!   next list, a 410 relisting, a broken watch reopened, failures (500, garbage, timeout,
//!   connection refused, wrong token or CA) reported with the last good snapshot kept; and a
//!   real `prometheus` scraping an exporter the test serves: wca's default queries answering in
//!   GB, and `examples/kube-state-metrics/placement.yaml` on kube-state-metrics' series.
//! - `upgrade`: a storage dir and log dir laid out by hand as verwalter 0.13 leaves them: its
//!   schedule is the first run's parent and kept as a backup, its backups join ours and
//!   retention goes on counting them, the deployment log continues the same index and segments,
//!   and a restart finds nothing more to migrate.
//! - `wasm`: a node whose scheduler is `examples/wasm-scheduler`'s WebAssembly module: it
//!   schedules and serves the module; a module replaced by a trapping or a runaway one leaves
//!   the last good schedule with the error in `/v1/status`, and the good one clears it; a node
//!   with `examples/wasm-query`'s `query.wasm` renders the same files as without it and answers
//!   `/v1/query`.
//! - `webdriver`: a small W3C WebDriver client for browser tests (headless Chromium through
//!   chromedriver; panics when either is missing), and its self-test against the daemon.

mod util;
mod webdriver;

mod actions;
mod cli;
mod cluster;
mod crash;
mod daemon;
mod datacenters;
mod dc_proxy;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod etcd_move;
mod extender;
mod frontend;
mod fuzz;
mod graph_nats;
mod graph_prod;
mod graphql;
mod hostile;
mod kubernetes;
mod layout;
mod lithos;
mod mixed;
mod notify;
mod package;
mod partition;
mod placement_cli;
mod render;
mod scheduler_metrics;
mod shadow;
mod shadow_render;
mod soak;
mod sources;
mod upgrade;
mod wasm;
