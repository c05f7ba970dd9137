//! The cluster: peer sources, the election over UDP, schedule distribution.

pub mod coding;
pub mod datacenters;
pub(crate) mod dc_metrics;
pub(crate) mod election;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod metrics;
pub mod peers;
pub(crate) mod replication;
pub mod vouch;
