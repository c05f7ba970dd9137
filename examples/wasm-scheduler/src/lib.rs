//! A verwalter scheduler in Rust, for `wasm32-unknown-unknown`: places every role's instances
//! over all nodes, one instance of a role per node, on the nodes with the most free CPU and
//! memory. It computes what `benches/placement/scheduler/v1/main.lua` computes, and the tests
//! of verwalter check that both give the same schedule.
//!
//! The module interface is verwalter 0.13's (docs/scheduler.md, "WebAssembly schedulers"):
//! exports `memory`, `alloc(len) -> ptr`, `dealloc(ptr)` and `scheduler(ptr, len) -> ptr`; the
//! input is the scheduler state as JSON, the result is
//! `{"schedule": {..}, "log": "..", "actions": {..}}` as JSON at the returned pointer. A panic
//! reports its message through the `env.log_panic` import before the module traps.

use serde_json::{Map, Value, json};

/// What one node offers.
const CPU: i64 = 16;
const MEM: i64 = 64;

/// Bytes before each allocation that keep its size, so that `dealloc(ptr)` needs no length.
const HEADER: usize = 8;

/// Allocates `len` bytes for the host.
#[unsafe(no_mangle)]
pub extern "C" fn alloc(len: i32) -> i32 {
    let size = len as usize + HEADER;
    let layout = std::alloc::Layout::from_size_align(size, HEADER).expect("a valid layout");
    // SAFETY: the layout is non-zero in size; the size is kept in the header for `dealloc`.
    unsafe {
        let base = std::alloc::alloc(layout);
        if base.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        (base as *mut usize).write(size);
        base.add(HEADER) as usize as i32
    }
}

/// Frees what `alloc` returned.
#[unsafe(no_mangle)]
pub extern "C" fn dealloc(ptr: i32) {
    // SAFETY: `ptr` came from `alloc`, which wrote the size before it.
    unsafe {
        let base = (ptr as usize - HEADER) as *mut u8;
        let size = (base as *const usize).read();
        std::alloc::dealloc(
            base,
            std::alloc::Layout::from_size_align_unchecked(size, HEADER),
        );
    }
}

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn log_panic(
        payload: *const u8,
        payload_len: usize,
        file: *const u8,
        file_len: usize,
        line: u32,
    );
}

#[cfg(target_arch = "wasm32")]
fn report_panics() {
    std::panic::set_hook(Box::new(|info| {
        let message = info.payload_as_str().unwrap_or("(no message)");
        let (file, line) = info.location().map_or(("?", 0), |l| (l.file(), l.line()));
        // SAFETY: both slices are valid for the duration of the call.
        unsafe {
            log_panic(
                message.as_ptr(),
                message.len(),
                file.as_ptr(),
                file.len(),
                line,
            )
        }
    }));
}

#[cfg(not(target_arch = "wasm32"))]
fn report_panics() {}

/// The entry point: `len` bytes of input JSON at `ptr`; returns where the result JSON is.
#[unsafe(no_mangle)]
pub extern "C" fn scheduler(ptr: i32, len: i32) -> i32 {
    report_panics();
    // SAFETY: the host wrote `len` bytes at `ptr`, memory it got from `alloc`.
    let input = unsafe { std::slice::from_raw_parts(ptr as usize as *const u8, len as usize) };
    let state: Value = match serde_json::from_slice(input) {
        Ok(state) => state,
        Err(e) => panic!("cannot decode the scheduler input: {e}"),
    };
    let (schedule, log) = schedule(&state);
    let result = json!({"schedule": schedule, "log": log});
    let bytes = serde_json::to_vec(&result).expect("JSON values serialize");
    let out = alloc(bytes.len() as i32);
    // SAFETY: `alloc` returned `bytes.len()` writable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as usize as *mut u8, bytes.len());
    }
    out
}

/// The newest version key (`v<N>...`, by N), as the Lua scheduler picks it.
fn newest(versions: &Map<String, Value>) -> Option<&str> {
    let mut best: Option<(&str, u64)> = None;
    for key in versions.keys() {
        let Some(digits) = key.strip_prefix('v') else {
            continue;
        };
        let digits: String = digits.chars().take_while(char::is_ascii_digit).collect();
        let Ok(n) = digits.parse::<u64>() else {
            continue;
        };
        if best.is_none_or(|(_, b)| n > b) {
            best = Some((key, n));
        }
    }
    best.map(|(key, _)| key)
}

fn int(value: &Value, key: &str) -> i64 {
    value.get(key).and_then(Value::as_i64).unwrap_or(0)
}

/// The schedule and log for the scheduler state `state`.
pub fn schedule(state: &Value) -> (Value, String) {
    let mut names: Vec<String> = vec![state["current_host"].as_str().unwrap_or("").to_string()];
    if let Some(peers) = state["peers"].as_object() {
        names.extend(
            peers
                .values()
                .filter_map(|p| p["hostname"].as_str())
                .map(String::from),
        );
    }
    names.sort();
    // Free CPU, free memory and instances placed, by the node's index in `names`.
    let mut free: Vec<(i64, i64, i64)> = vec![(CPU, MEM, 0); names.len()];

    let empty = Map::new();
    let runtime = state["runtime"].as_object().unwrap_or(&empty);
    let mut roles = Map::new();
    let mut nodes = Map::new();
    let mut unplaced = 0;
    // serde_json's map is sorted by key: the roles come in the order the Lua scheduler sorts.
    for (role, versions) in runtime {
        let versions = versions.as_object().unwrap_or(&empty);
        let Some(version) = newest(versions) else {
            continue;
        };
        let meta = &versions[version];
        let mut info = Map::new();
        info.insert("version".into(), json!(version));
        if let Some(image) = meta.get("image").filter(|i| !i.is_null()) {
            info.insert("image".into(), image.clone());
        }
        info.insert("template".into(), json!("svc/v1"));
        roles.insert(role.clone(), Value::Object(info));

        let (want, cpu, mem) = (
            int(meta, "instances"),
            int(meta, "cpu"),
            int(meta, "memory"),
        );
        // The `want` best-scored nodes that fit, best first (ties keep the earlier node).
        let mut best: Vec<(f64, usize)> = Vec::new();
        for (index, &(fc, fm, count)) in free.iter().enumerate() {
            if fc < cpu || fm < mem || want <= 0 {
                continue;
            }
            let score = fc as f64 / CPU as f64 + fm as f64 / MEM as f64 - count as f64 * 0.01;
            let kept = best.len() as i64;
            if kept < want || score > best[best.len() - 1].0 {
                if kept >= want {
                    best.pop();
                }
                let at = best
                    .iter()
                    .position(|(s, _)| *s < score)
                    .unwrap_or(best.len());
                best.insert(at, (score, index));
            }
        }
        for &(_, index) in &best {
            let entry = &mut free[index];
            entry.0 -= cpu;
            entry.1 -= mem;
            entry.2 += 1;
            let node = nodes
                .entry(names[index].clone())
                .or_insert_with(|| json!({"roles": {}}));
            let mut placed = Map::new();
            placed.insert("instances".into(), json!(1));
            placed.insert("version".into(), json!(version));
            if let Some(image) = meta.get("image").filter(|i| !i.is_null()) {
                placed.insert("image".into(), image.clone());
            }
            node["roles"][role.as_str()] = Value::Object(placed);
        }
        unplaced += want - best.len() as i64;
    }
    let log = format!(
        "placed {} roles over {} nodes, {} instances unplaced",
        runtime.len(),
        names.len(),
        unplaced
    );
    (
        json!({"vars": {"cluster": "bench"}, "roles": roles, "nodes": nodes}),
        log,
    )
}
