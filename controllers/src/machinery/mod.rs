//! The substrate every controller stands on; it knows no subsystem.
//!
//! - [`store`]: `Field`, `Reader`, `Trigger`: one writer per field, readers get `Arc` snapshots and
//!   wake on change, and a write that changes nothing wakes no one.
//! - [`driver`]: the loop every controller runs in (wake on change, requeue timer, resync,
//!   per-key dedup and backoff, graceful shutdown).
//! - [`ports`]: traits for every side effect (scheduler, schedule persistence, deployment log,
//!   journal, graph bus).
//! - [`clock`]: the wall clock port and the one timestamp format people read (RFC 3339, UTC).
//! - [`watchdog`]: whether the drivers make progress (systemd's watchdog pings only then).
//! - [`backoff`]: the one backoff: doubling or fixed waits, with or without jitter.

pub mod backoff;
pub mod clock;
pub mod driver;
pub mod ports;
pub mod store;
pub mod watchdog;
