//! wca-scheduler's placement algorithms as pure functions: no I/O, no clock.
//!
//! - [`snapshot`]: what the algorithms read (node capacities, assigned apps, app requests, node
//!   facts, app profiles) and the resource arithmetic they share (used + requested, the
//!   memory-bandwidth rules, the Fit check).
//! - [`algorithms`]: the [`Algorithm`]s (NOP, Fit, BAR, LeastUsed, LeastUsedBAR, HierBAR,
//!   StaticAssigner, DramHitRatioProvision, Score), the two filter passes and prioritize.
//! - [`config`]: [`config::load`] reads a YAML config with wca's tags into algorithms.
//! - [`extender`]: the Kubernetes scheduler extender's wire types and replies.
//! - [`simulate`]: [`place`] (filter, prioritize, pick one node) and the cluster simulator that
//!   reports placement quality.
//!
//! The formulas and the choices made where wca has a quirk are in `docs/placement.md`.

pub mod algorithms;
pub mod config;
pub mod extender;
pub mod simulate;
pub mod snapshot;

pub use algorithms::{Algorithm, FilterResult, Kind, PlacementError};
pub use simulate::{SimulationReport, place, simulate};
pub use snapshot::{Assigned, Dim, NodeFacts, NodeType, Snapshot, Usage};
