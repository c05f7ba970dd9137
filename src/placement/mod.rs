//! Placement as a service: wca-scheduler's algorithms (crate `verwalter-placement`) fed with data
//! that is refreshed in the background, never on the request path.
//!
//! - [`store`]: the [`store::SnapshotStore`] every reader (the extender, the Lua scheduler) takes
//!   its snapshot from, and every data source writes to.
//! - [`check`]: `verwalter check --placement-config FILE`, reading the file and the environment.

pub mod check;
pub mod store;
