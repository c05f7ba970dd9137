//! wca-scheduler's placement algorithms as pure functions: no I/O, no clock.
//!
//! - [`snapshot`]: what the algorithms read (node capacities, assigned apps, app requests, node
//!   facts, app profiles) and the resource arithmetic they share (used + requested, the
//!   memory-bandwidth rules, the Fit check).
//! - [`algorithms`]: the [`Algorithm`]s (NOP, Fit, BAR, LeastUsed, LeastUsedBAR, HierBAR,
//!   StaticAssigner, DramHitRatioProvision, Score), the two filter passes and prioritize.
//! - [`config`]: [`config::load_config`] reads a YAML config with wca's tags (wca's
//!   `config.yaml` or our `algorithms:` form) into algorithms and the other top-level settings.
//! - [`extender`]: the Kubernetes scheduler extender's wire types and replies.
//! - [`loggers`]: wca's `loggers:` as log filter directives.
//! - [`simulate`]: [`place`] (filter, prioritize, pick one node) and the cluster simulator that
//!   reports placement quality.
//! - [`reschedule`]: Score's reschedule hook, the running instances that should move.
//! - [`experiment`]: the simulator's node and task files, read into a snapshot and a task list.
//! - [`report`]: the simulator's reports for several algorithms as a text table or JSON.
//! - `probe`: the names serde's derive knows (an enum's variants, a struct's fields), so that
//!   lists shown to users are read from the serde definitions.
//!
//! The formulas and the choices made where wca has a quirk are in `docs/placement.md`.

// No production function over 120 lines (the threshold is the workspace's clippy.toml); tests
// may be longer.
// The crate is not published: its docs are read with the private items
// (`cargo doc --workspace --no-deps --document-private-items`), where these links resolve.
#![allow(rustdoc::private_intra_doc_links)]
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]
// Items are `pub(crate)` unless the daemon's crate, its tests or benches, or this crate's tests or
// benches use them.
#![warn(unreachable_pub)]

pub mod algorithms;
pub mod config;
pub mod experiment;
pub mod extender;
pub mod loggers;
pub mod placer;
mod probe;
pub mod report;
pub mod reschedule;
pub mod simulate;
pub mod snapshot;
pub mod sources;

pub use algorithms::{Algorithm, FilterResult, Kind, PlacementError};
pub use placer::{Placement, Placer};
pub use reschedule::reschedule;
pub use simulate::{SimulationReport, place, simulate};
pub use snapshot::{Assigned, Dim, NodeFacts, NodeType, Snapshot, Usage};
