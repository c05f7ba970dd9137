//! Placement as a service: wca-scheduler's algorithms (crate `verwalter-placement`) fed with data
//! that is refreshed in the background, never on the request path.
//!
//! - [`store`]: the [`store::SnapshotStore`] every reader (the extender, the Lua scheduler) takes
//!   its snapshot from, and every data source writes to.
//! - [`simulate`]: the `verwalter placement simulate` command (files in, report and chart out);
//!   [`chart`] draws its SVG with plotters.

pub mod chart;
pub mod simulate;
pub mod store;
