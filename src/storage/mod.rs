//! What the daemon keeps on disk.
//!
//! - [`state_dir`]: `/var/lib/verwalter`, where the schedule in force is persisted.
//! - [`slots`]: the two slot files the schedule in force is flushed to, by turns.
//! - [`backups`]: hourly, daily and weekly gzipped copies of the schedule.
//! - [`upgrade`]: the first start on what verwalter 0.13 left in the storage and log dirs.
//! - [`logs`]: the deployment log (index, global, changes, per role), rotation, retention.

pub(crate) mod backups;
pub mod logs;
pub(crate) mod slots;
pub mod state_dir;
pub(crate) mod upgrade;
