//! The cluster: peer sources, the election over UDP, schedule distribution.

pub mod coding;
pub mod election;
pub mod metrics;
pub mod peers;
pub mod replication;
pub mod vouch;
