//! The cluster: peer sources, the election over UDP, schedule distribution.

pub mod coding;
pub mod election;
pub mod fetch;
pub mod peers;
pub mod vouch;
