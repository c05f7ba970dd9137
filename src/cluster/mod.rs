//! The cluster: peer sources, the election over UDP, schedule distribution.

pub mod coding;
pub mod election;
pub mod fetch;
pub mod metrics;
pub mod peers;
pub mod vouch;
