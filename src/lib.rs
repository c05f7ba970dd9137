//! verwalter: the node daemon that keeps a cluster's services configured.
//!
//! This crate holds the adapters that touch the world and the binary; the decisions live in
//! `verwalter-controllers`. A tour:
//! - [`actions`]: the leader's queue of operator actions.
//! - [`allocator`]: glibc malloc tuning for the Lua VM.
//! - [`identity`]: the machine id and host name, read in one place.
//! - [`config`]: daemon settings from the command line and an optional settings file.
//! - [`inputs`]: reads `/etc/verwalter` (runtime tree, scheduler sources) and watches it.
//! - [`lua`]: the sandboxed Lua scheduler.
//! - [`cluster`]: peer sources (cantal, static list), the election over UDP, schedule fetches.
//! - [`render`]: template dirs (Handlebars, Tera, `*.render.yaml`) and the role applier.
//! - [`apply`]: the apply commands (`!Cmd`, `!Copy`, ...).
//! - [`logs`]: the deployment log (index, global, changes, per role), rotation, retention.
//! - [`backups`]: hourly, daily and weekly gzipped copies of the schedule.
//! - [`state_dir`]: `/var/lib/verwalter`, where the schedule in force is persisted.
//! - [`upgrade`]: the first start on what verwalter 0.13 left in the storage and log dirs.
//! - [`http`]: the HTTP API, `/metrics` and the web frontend (`frontend/`, embedded).
//! - [`paths`]: path containment (symlinks must not lead out of a dir).
//! - [`placement`]: placement data refreshed in the background, for the extender and Lua.
//! - [`metrics`]: the Prometheus families.
//! - [`daemon`]: wires it all together under one shutdown signal.
//! - [`graph`]: the ernest-style graph executor over NATS (`verwalter graph`, `graph:` settings).
//! - [`systemd`]: readiness, status line, watchdog pings and stopping, for systemd.

pub mod actions;
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
