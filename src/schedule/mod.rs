//! The scheduler the leader runs over the config dir, and what feeds it.
//!
//! - [`lua`]: the sandboxed Lua scheduler (`scheduler/v1/main.lua`); [`lua::allocator`]: glibc
//!   malloc tuning for the Lua VM.
//! - [`wasm`]: WebAssembly schedulers (`scheduler/v1/scheduler.wasm`) in the wasmi interpreter,
//!   and the query hook.
//! - [`scheduler_metrics`]: the Lua scheduler's `state.metrics`, the queries of
//!   `scheduler/v1/metrics.yaml` ([`scheduler_metrics::file`]) refreshed on the leader into the
//!   store.

pub mod lua;
pub mod scheduler_metrics;
pub mod wasm;
