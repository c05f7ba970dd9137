//! What every subsystem of the daemon leans on, knowing none of them.
//!
//! - [`systemd`]: readiness, status line, watchdog pings and stopping, for systemd.
//! - [`paths`]: path containment (symlinks must not lead out of a dir).
//! - [`identity`]: the machine id and host name, read in one place.

pub mod identity;
pub mod paths;
pub mod systemd;
