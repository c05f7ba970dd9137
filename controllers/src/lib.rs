//! The reconcile core of verwalter: what the daemon decides, with no IO of its own.
//!
//! Layers, each importing only those above it: data ([`state`], [`defaults`]), then the
//! substrate ([`machinery`]), then the subsystems, then [`node`] (the field set naming every
//! subsystem's field).
//!
//! A tour of the modules:
//! - [`state`]: typed observed and desired state (inputs, peers, schedule, scheduler status).
//! - [`defaults`]: every built-in default of the settings, in one table.
//! - [`machinery`]: the substrate every controller stands on, knowing no subsystem:
//!   - [`machinery::store`]: store fields; readers get `Arc` snapshots and wake on change, one
//!     writer per field, and a write that changes nothing wakes no one;
//!   - [`machinery::driver`]: the loop every controller runs in (wake on change, requeue timer,
//!     resync, per-key dedup and backoff, graceful shutdown);
//!   - [`machinery::ports`]: traits for every side effect (scheduler, schedule persistence,
//!     deployment log, journal, graph bus);
//!   - [`machinery::clock`]: the wall clock port and the one timestamp format people read
//!     (RFC 3339, UTC);
//!   - [`machinery::watchdog`]: whether the drivers make progress (systemd's watchdog pings
//!     only then).
//!   - [`machinery::backoff`]: the one backoff (the driver's per-key retries, replication's, the
//!     pod watch's, the graph executor's).
//! - [`node`]: `Store` and `StoreWriter`, every field this node holds.
//! - [`graph`]: dependency graphs: cycles named, waves, an execution's ready set with in-degree
//!   counters and its error policy (block dependents, or halt).
//! - [`refs`]: `$(path)` references inside JSON values, resolved against a document (gjson-style
//!   paths, recursive, cycle-safe).
//! - [`inputs`]: what the config dir's watcher decides (when a burst of changes is read, what
//!   stays after a failed read).
//! - [`cluster`]: who leads and how schedules travel:
//!   - [`cluster::election`]: the sans-IO leader election state machine and its controller;
//!   - [`cluster::replication`]: what a follower fetches, what a new leader gathers as parents;
//!   - [`cluster::peers`]: when a peer list changed.
//!   - [`cluster::etcd`]: leadership and publishing on etcd (not run by the daemon yet);
//!   - [`cluster::datacenters`]: the exchange between the leaders of several data centers.
//! - [`schedule`]: the leader's schedule controller (inputs changed -> run the scheduler):
//!   - [`schedule::data`]: a schedule's `data`, held as its canonical JSON and parsed into a
//!     tree only when read whole;
//!   - [`schedule::diff`]: the structural diff of a real and a shadow schedule (roles, nodes,
//!     differing paths);
//!   - [`schedule::hash`]: the schedule hash, byte-compatible with verwalter 0.13;
//!   - [`schedule::persist`]: writes the schedule in force to the storage dir, retrying until it
//!     is written;
//!   - [`schedule::scheduler_metrics`]: `state.metrics` of the Lua scheduler (the declared
//!     queries' last good answers, kept on failure, with their age at the run's `now`).
//! - [`render`]: renders and applies each role of this node (one deployment id a pass);
//!   [`render::vars`]: role variables from the schedule (the merge rule, roles of a node).
//! - [`storage`]: what the storage and log dirs keep:
//!   - [`storage::cleanup`]: forgets roles gone from the schedule; runs the sweep (log and
//!     backup retention);
//!   - [`storage::retention`]: which schedule backups to take and prune, which deployment log
//!     files to delete (age, total size), when a log segment is full;
//!   - [`storage::upgrade`]: the first start on what verwalter 0.13 left: which layout a storage
//!     dir shows, what to move, copy or remove.
//! - [`actions`]: the leader's queue of operator actions (caps, ids, journal, answers).
//! - [`http`]: what the HTTP API decides before anything runs:
//!   - [`http::access`]: which HTTP requests are refused (Host names of this node, same origin,
//!     form body types, tokens, caps);
//!   - [`http::graphql_cost`]: what a GraphQL document stands for with its fragments expanded,
//!     counted without expanding them (refused past a cap before anything runs it);
//!   - [`http::subscriptions`]: which subscription results go out.
//! - [`status`]: the status view (`/v1/status`, `/v1/events`, metrics) from one store snapshot.
//! - [`ernest`]: ernest's builds over NATS without the NATS: what to dispatch, what an answer
//!   changes, timeouts, one result per build, the state a restart resumes from;
//!   [`ernest::build_retention`]: the executor's stored builds (what `verwalter graph builds`
//!   shows, which finished builds are pruned, how often the executor looks).
//! - `testing`: fakes and fixtures for tests (with `cfg(test)` or the `testing` feature only).

#![warn(unreachable_pub)]
// No production function over 120 lines (the threshold is the workspace's clippy.toml); tests
// may be longer.
// The crate is not published: its docs are read with the private items
// (`cargo doc --workspace --no-deps --document-private-items`), where these links resolve.
#![allow(rustdoc::private_intra_doc_links)]
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

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
