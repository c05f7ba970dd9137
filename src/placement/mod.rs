//! Placement as a service: wca-scheduler's algorithms (crate `verwalter-placement`) fed with data
//! that is refreshed in the background, never on the request path.
//!
//! - [`store`]: the [`store::SnapshotStore`] every reader (the extender, the Lua scheduler) takes
//!   its snapshot from, and every data source writes to.
//! - [`start`]: [`start::start_sources`], the one place the data sources are started.
//! - [`snapshot_file`]: the snapshot file source (JSON or YAML, re-read when it changes).
//! - [`extender`]: the Kubernetes scheduler extender's HTTP server (`verwalter extender`).

pub mod extender;
pub mod snapshot_file;
pub mod start;
pub mod store;
