//! Stops a Lua run that passes its deadline, without slowing down runs that do not.
//!
//! An instruction-count hook set for the whole run puts the Lua VM into its tracing mode, which
//! measured 1.6x slower on a placement scheduler. Instead a watchdog thread sleeps until the
//! deadline and only then installs a hook that raises an error at the next instruction. Setting
//! a hook from outside the running thread is what the Lua manual allows for signal handlers
//! (`lua.c` stops scripts on Ctrl-C this way), and Lua 5.4 re-reads its trap flag on every
//! backward jump so even an empty `while true do end` stops.

#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use mlua::ffi;

/// Message of the error raised in a run that passed its deadline.
pub(crate) const TIMEOUT_MARK: &str = "scheduler exceeded its time budget";

/// The hook installed at the deadline: raise an error at the next instruction.
unsafe extern "C-unwind" fn stop_hook(state: *mut ffi::lua_State, _ar: *mut ffi::lua_Debug) {
    // SAFETY: called by Lua on `state`'s own thread with a valid state; raising an error from a
    // hook is allowed and unwinds to the protected call mlua made.
    unsafe {
        ffi::lua_pushstring(state, c"scheduler exceeded its time budget".as_ptr());
        ffi::lua_error(state);
    }
}

/// The raw state of a running Lua call.
#[derive(Clone, Copy)]
struct StatePtr(*mut ffi::lua_State);

// SAFETY: the pointer is only used for `lua_sethook`, which Lua allows from another context
// while the state runs, and only between `arm` and `disarm`, while the state is alive.
unsafe impl Send for StatePtr {}

struct Armed {
    state: Option<StatePtr>,
    deadline: Instant,
    fired: bool,
    shutdown: bool,
}

/// One watchdog thread per Lua state.
pub(crate) struct Watchdog {
    shared: Arc<(Mutex<Armed>, Condvar)>,
}

impl Watchdog {
    pub(crate) fn start() -> std::io::Result<Watchdog> {
        let shared = Arc::new((
            Mutex::new(Armed {
                state: None,
                deadline: Instant::now(),
                fired: false,
                shutdown: false,
            }),
            Condvar::new(),
        ));
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("lua-watchdog".into())
            .spawn(move || watch(thread_shared))?;
        Ok(Watchdog { shared })
    }

    /// Arms the watchdog for a call on `lua` that must end by `deadline`.
    pub(crate) fn arm(&self, lua: &mlua::Lua, deadline: Instant) {
        let state = lua.exec_raw_lua(|raw| raw.state());
        let (lock, wake) = &*self.shared;
        let mut armed = lock.lock().expect("watchdog lock");
        armed.state = Some(StatePtr(state));
        armed.deadline = deadline;
        armed.fired = false;
        wake.notify_one();
    }

    /// Disarms after the call; removes the stop hook if it was installed. Returns whether the
    /// deadline passed during the call.
    pub(crate) fn disarm(&self) -> bool {
        let (lock, _) = &*self.shared;
        let mut armed = lock.lock().expect("watchdog lock");
        let fired = armed.fired;
        if let (true, Some(StatePtr(state))) = (fired, armed.state) {
            // SAFETY: the call has returned, so this thread owns the state; clearing hooks is
            // always allowed.
            unsafe { ffi::lua_sethook(state, None, 0, 0) };
        }
        armed.state = None;
        armed.fired = false;
        fired
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, wake) = &*self.shared;
        if let Ok(mut armed) = lock.lock() {
            armed.shutdown = true;
            armed.state = None;
        }
        wake.notify_one();
    }
}

fn watch(shared: Arc<(Mutex<Armed>, Condvar)>) {
    let (lock, wake) = &*shared;
    let mut armed = lock.lock().expect("watchdog lock");
    loop {
        if armed.shutdown {
            return;
        }
        match armed.state {
            Some(StatePtr(state)) if !armed.fired => {
                let now = Instant::now();
                if now >= armed.deadline {
                    let mask = ffi::LUA_MASKCOUNT | ffi::LUA_MASKCALL | ffi::LUA_MASKRET;
                    // SAFETY: the state is alive and running (armed, not yet disarmed; disarm
                    // needs this lock). `lua_sethook` is the asynchronous stop Lua provides.
                    unsafe { ffi::lua_sethook(state, Some(stop_hook), mask as c_int, 1) };
                    armed.fired = true;
                } else {
                    let wait = armed.deadline - now;
                    armed = wake.wait_timeout(armed, wait).expect("watchdog lock").0;
                }
            }
            _ => armed = wake.wait(armed).expect("watchdog lock"),
        }
    }
}
