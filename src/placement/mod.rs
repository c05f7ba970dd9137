//! Placement as a service: wca-scheduler's algorithms (crate `verwalter-placement`) fed with data
//! that is refreshed in the background, never on the request path.
//!
//! - [`store`]: the [`store::SnapshotStore`] every reader (the extender, the Lua scheduler) takes
//!   its snapshot from, and every data source writes to.
//! - [`check`]: `verwalter check --placement-config FILE`, reading the file and the environment.
//! - [`refresh`]: [`refresh::spawn_sources`], the background refresh of a data provider's
//!   Kubernetes API and Prometheus sources into a store; through [`kube`] (lists and the pod
//!   watch), [`prometheus`] (instant queries, [`prometheus::instant_query`]) and [`request`]
//!   (their requests over the HTTPS kind of [`crate::machinery::http_client`]); [`metrics`] counts refreshes.
//! - [`simulate`]: the `verwalter placement simulate` command (files in, report and chart out);
//!   [`chart`] draws its SVG with plotters.
//! - [`start`]: [`start::start_sources`], the one place the data sources are started.
//! - [`snapshot_file`]: the snapshot file source (JSON or YAML, re-read when it changes).
//! - [`extender`]: the Kubernetes scheduler extender's HTTP server (`verwalter extender`).
//! - [`input`]: reading their input files: regular files only, within a size cap.

pub(crate) mod chart;
pub mod check;
pub mod extender;
pub(crate) mod input;
pub(crate) mod kube;
pub(crate) mod metrics;
pub(crate) mod prometheus;
pub mod refresh;
pub(crate) mod request;
pub mod simulate;
pub mod snapshot_file;
pub(crate) mod start;
pub mod store;
