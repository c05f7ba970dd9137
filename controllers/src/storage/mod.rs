//! What the storage and log dirs keep.
//!
//! - [`cleanup`]: forgets roles gone from the schedule; runs the sweep (log and backup retention).
//! - [`retention`]: which schedule backups to take and prune, which deployment log files to
//!   delete (age, total size), when a log segment is full.
//! - [`slots`]: which stored schedule a start takes (the newest valid slot, or `schedule.json`),
//!   and where the next one is written.
//! - [`upgrade`]: the first start on what verwalter 0.13 left: which layout a storage dir shows,
//!   what to move, copy or remove.

pub mod cleanup;
pub mod retention;
pub mod slots;
pub mod upgrade;
