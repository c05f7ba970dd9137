//! The scheduler the leader runs over the config dir, and what feeds it.
//!
//! - [`thread`]: the scheduler thread, the one adapter between the `Scheduler` port and a
//!   scheduler on an OS thread of its own (time budget plus grace, a stuck run refuses the
//!   next ones, the watchdog's records).
//! - [`ConfigDirScheduler`]: the wasm module when `scheduler.wasm` exists, else the Lua
//!   scheduler.
//! - [`lua`]: the sandboxed Lua scheduler (`scheduler/v1/main.lua`); [`lua::allocator`]: glibc
//!   malloc tuning for the Lua VM.
//! - [`wasm`]: WebAssembly schedulers (`scheduler/v1/scheduler.wasm`) in the wasmi interpreter,
//!   and the query hook.
//! - [`shadow`]: shadow schedulers, candidates run on every real round beside `scheduler/v1`
//!   without acting (`scheduler/shadow.yaml`).
//! - [`scheduler_metrics`]: the Lua scheduler's `state.metrics`, the queries of
//!   `scheduler/v1/metrics.yaml` ([`scheduler_metrics::file`]) refreshed on the leader into the
//!   store.

pub mod lua;
pub mod scheduler_metrics;
pub mod shadow;
pub(crate) mod thread;
pub mod wasm;

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use verwalter_controllers::machinery::ports::{Scheduler, SchedulerError};
use verwalter_controllers::state::{SchedulerInput, SchedulerOutput};

use lua::LuaScheduler;
use wasm::{WasmScheduler, has_wasm_scheduler};

/// The daemon's scheduler: `scheduler/v1/scheduler.wasm` when it exists, else `main.lua`. The
/// choice is made per run, so replacing one by the other takes effect like any code change.
pub(crate) struct ConfigDirScheduler {
    config_dir: PathBuf,
    lua: LuaScheduler,
    wasm: WasmScheduler,
}

impl std::fmt::Debug for ConfigDirScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigDirScheduler")
    }
}

impl ConfigDirScheduler {
    pub(crate) fn new(
        config_dir: PathBuf,
        lua: LuaScheduler,
        wasm: WasmScheduler,
    ) -> ConfigDirScheduler {
        ConfigDirScheduler {
            config_dir,
            lua,
            wasm,
        }
    }
}

impl Scheduler for ConfigDirScheduler {
    fn run(
        &self,
        code_version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>> {
        if has_wasm_scheduler(&self.config_dir) {
            self.wasm.run(code_version, input)
        } else {
            self.lua.run(code_version, input)
        }
    }
}
