//! The reconcile core of verwalter: what the daemon decides, with no IO of its own.
//!
//! A tour of the modules:
//! - [`actions`]: the leader's queue of operator actions (caps, ids, journal, answers).
//! - [`state`]: typed observed and desired state (inputs, peers, schedule, scheduler status).
//! - [`store`]: the shared store; readers get `Arc` snapshots and wake on change, one writer per
//!   field, and a write that changes nothing wakes no one.
//! - [`ports`]: traits for every side effect (scheduler, schedule persistence, clock).
//! - [`defaults`]: every built-in default of the settings, in one table.
//! - [`access`]: which HTTP requests are refused (Host names of this node, same origin, form
//!   body types).
//! - [`build_retention`]: the graph executor's stored builds: what `verwalter graph builds`
//!   shows, which finished builds are pruned, how often the executor looks.
//! - [`cleanup`]: forgets roles gone from the schedule; runs the sweep (log and backup retention).
//! - [`driver`]: the loop every controller runs in (wake on change, requeue timer, resync,
//!   per-key dedup and backoff, graceful shutdown).
//! - [`election`]: the sans-IO leader election state machine and its controller.
//! - [`ernest`]: ernest's builds over NATS without the NATS: what to dispatch, what an answer
//!   changes, timeouts, one result per build, the state a restart resumes from.
//! - [`graphql_cost`]: what a GraphQL document stands for with its fragments expanded, counted
//!   without expanding them (refused past a cap before anything runs it).
//! - [`graph`]: dependency graphs: cycles named, waves, an execution's ready set with in-degree
//!   counters and its error policy (block dependents, or halt).
//! - [`refs`]: `$(path)` references inside JSON values, resolved against a document (gjson-style
//!   paths, recursive, cycle-safe).
//! - [`render`]: renders and applies each role of this node (one deployment id a pass).
//! - [`persist`]: writes the schedule in force to the storage dir, retrying until it is written.
//! - [`replication`]: what a follower fetches, what a new leader gathers as parents (sans-IO).
//! - [`schedule`]: the leader's schedule controller (inputs changed -> run the scheduler).
//! - [`scheduler_metrics`]: `state.metrics` of the Lua scheduler (the declared queries' last
//!   good answers, kept on failure, with their age at the run's `now`).
//! - [`status`]: the status view (`/v1/status`, `/v1/events`, metrics) from one store snapshot.
//! - [`retention`]: which schedule backups to take and prune, which deployment log files to
//!   delete (age, total size), when a log segment is full.
//! - [`sources`]: what the sources of the store decide before writing (when a burst of config
//!   changes is read, what stays after a failed read, when a peer list changed).
//! - [`hash`]: the schedule hash, byte-compatible with verwalter 0.13.
//! - [`vars`]: role variables from the schedule (the merge rule, roles of a node).
//! - [`upgrade`]: the first start on what verwalter 0.13 left: which layout a storage dir shows,
//!   what to move, copy or remove.
//! - [`wallclock`]: the one timestamp format people read (RFC 3339, UTC).
//! - [`watchdog`]: whether the drivers make progress (systemd's watchdog pings only then).
//! - `testing`: fakes and fixtures for tests (with `cfg(test)` or the `testing` feature only).

pub mod actions;
pub mod cluster;
pub mod defaults;
pub mod ernest;
pub mod graph;
pub mod http;
pub mod inputs;
pub mod machinery;
pub mod node;
pub mod refs;
pub mod render;
pub mod schedule;
pub mod state;
pub mod status;
pub mod storage;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
