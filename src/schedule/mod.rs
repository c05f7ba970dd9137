//! The scheduler the daemon runs, and what Lua and wasm schedulers share.
//!
//! - [`thread`]: the scheduler thread, the one adapter between the `Scheduler` port and a
//!   scheduler on an OS thread of its own (time budget plus grace, a stuck run refuses the
//!   next ones, the watchdog's records).
//! - [`ConfigDirScheduler`]: the wasm module when `scheduler.wasm` exists, else the Lua
//!   scheduler.

pub mod thread;

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use verwalter_controllers::ports::{Scheduler, SchedulerError};
use verwalter_controllers::state::{SchedulerInput, SchedulerOutput};

use crate::lua::LuaScheduler;
use crate::wasm::{WasmScheduler, has_wasm_scheduler};

/// The daemon's scheduler: `scheduler/v1/scheduler.wasm` when it exists, else `main.lua`. The
/// choice is made per run, so replacing one by the other takes effect like any code change.
pub struct ConfigDirScheduler {
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
    pub fn new(config_dir: PathBuf, lua: LuaScheduler, wasm: WasmScheduler) -> ConfigDirScheduler {
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
