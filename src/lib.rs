//! verwalter: the node daemon that keeps a cluster's services configured.
//!
//! This crate holds the adapters that touch the world and the binary; the decisions live in
//! `verwalter-controllers`. A tour, in the order the daemon starts them:
//! - [`config`]: daemon settings from the command line and an optional settings file.
//! - [`daemon`]: wires it all together under one shutdown signal.
//! - [`metrics`]: the Prometheus families.
//! - [`machinery`]: what every subsystem leans on:
//!   - [`machinery::systemd`]: readiness, status line, watchdog pings and stopping, for systemd;
//!   - [`machinery::paths`]: path containment (symlinks must not lead out of a dir);
//!   - [`machinery::identity`]: the machine id and host name, read in one place.
//!   - [`machinery::http_client`]: the one HTTP client (the cluster's fetches, the placement
//!     sources, the scheduler's metrics queries).
//! - [`storage`]: what the daemon keeps on disk:
//!   - [`storage::state_dir`]: `/var/lib/verwalter`, where the schedule in force is persisted;
//!   - [`storage::backups`]: hourly, daily and weekly gzipped copies of the schedule;
//!   - [`storage::upgrade`]: the first start on what verwalter 0.13 left in the storage and log
//!     dirs;
//!   - [`storage::logs`]: the deployment log (index, global, changes, per role), rotation,
//!     retention.
//! - [`inputs`]: reads `/etc/verwalter` (runtime tree, scheduler sources) and watches it.
//! - [`cluster`]: peer sources (cantal, static list), the election over UDP, schedule
//!   replication ([`cluster::replication`]).
//! - [`schedule`]: the schedulers the leader runs ([`schedule::ConfigDirScheduler`]: wasm when
//!   `scheduler.wasm` exists, else Lua):
//!   - [`schedule::thread`]: the one scheduler thread both run on (budget plus grace, a stuck
//!     run refuses the next ones);
//!   - [`schedule::lua`]: the sandboxed Lua scheduler (with [`schedule::lua::allocator`], glibc
//!     malloc tuning for the Lua VM);
//!   - [`schedule::wasm`]: WebAssembly schedulers and the query hook;
//!   - [`schedule::scheduler_metrics`]: the Lua scheduler's `state.metrics`, refreshed on the
//!     leader.
//! - [`render`]: template dirs (Handlebars, Tera, `*.render.yaml`) and the role applier;
//!   [`render::apply`]: the apply commands (`!Cmd`, `!Copy`, ...).
//! - `actions`: the leader's queue of operator actions.
//! - [`http`]: the HTTP API, `/metrics` and the web frontend (`frontend/`, embedded).
//! - [`ernest`]: the ernest-style graph executor over NATS (`verwalter graph`, `graph:`
//!   settings).
//! - [`placement`]: placement data refreshed in the background, for the extender and Lua.

// No production function over 120 lines (the threshold is the workspace's clippy.toml); tests
// may be longer.
// The crate is not published: its docs are read with the private items
// (`cargo doc --workspace --no-deps --document-private-items`), where these links resolve.
#![allow(rustdoc::private_intra_doc_links)]
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]
// Modules and items are `pub(crate)` unless the binary (`src/main.rs`), the tests or the benches
// use them.
#![warn(unreachable_pub)]

pub(crate) mod actions;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod ernest;
pub mod http;
pub mod inputs;
pub mod machinery;
pub mod metrics;
pub mod placement;
pub mod render;
pub mod schedule;
pub mod storage;
