//! The cluster: who leads, and how schedules travel between nodes (sans-IO).
//!
//! - [`election`]: the leader election state machine, its wire format, its transport rules and
//!   its controller.
//! - [`replication`]: what a follower fetches, what a new leader gathers as parents.
//! - [`peers`]: when a fresh read of the peer source counts as a new peer list.
//! - [`etcd`]: leadership and publishing on etcd (a design, not run by the daemon yet).
//! - [`datacenters`]: the exchange between the leaders of several data centers.

pub mod datacenters;
pub mod election;
pub mod etcd;
pub mod peers;
pub mod replication;
