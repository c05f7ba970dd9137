//! What every subsystem of the daemon leans on, knowing none of them.
//!
//! - [`systemd`]: readiness, status line, watchdog pings and stopping, for systemd.
//! - [`paths`]: path containment (symlinks must not lead out of a dir).
//! - [`identity`]: the machine id and host name, read in one place.
//! - [`http_client`]: the one HTTP client (plain HTTP for the cluster, HTTPS with a given CA).

pub(crate) mod http_client;
pub mod identity;
pub mod paths;
pub(crate) mod systemd;
