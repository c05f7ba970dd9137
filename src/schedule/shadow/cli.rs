//! `verwalter shadow`: the latest shadow diff from a running daemon, readably (`diff`), and the
//! promotion of a shadow to `scheduler/v1` (`promote`); docs/scheduler.md#shadow-schedulers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use super::config::SHADOW_FILE;

/// `verwalter shadow ...`.
#[derive(Debug, clap::Args)]
pub struct ShadowArgs {
    #[command(subcommand)]
    command: ShadowCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ShadowCommand {
    /// Print the latest run of each shadow scheduler (or of --name) with its diff against the
    /// real schedule, from the leader's API. Exit status 0: identical; 1: a shadow differs or
    /// failed; 2: no answer or no such shadow.
    Diff {
        /// The leader's address
        #[arg(long, default_value = "http://127.0.0.1:8379")]
        url: String,
        /// Only this shadow
        #[arg(long)]
        name: Option<String>,
    },
    /// Make shadow NAME the scheduler in force: scheduler/NAME becomes scheduler/v1, the old
    /// v1 is kept as scheduler/v1-replaced-<UTC time>, and NAME leaves scheduler/shadow.yaml.
    Promote {
        name: String,
        /// Config dir to use
        #[arg(long, value_name = "DIR", default_value = verwalter_controllers::defaults::CONFIG_DIR)]
        config_dir: PathBuf,
    },
}

/// Runs a `verwalter shadow` command.
pub fn run(args: &ShadowArgs) -> ExitCode {
    match &args.command {
        ShadowCommand::Diff { url, name } => match diff(url, name.as_deref()) {
            Ok((text, same)) => {
                print!("{text}");
                ExitCode::from(if same { 0 } else { 1 })
            }
            Err(error) => {
                eprintln!("verwalter shadow diff: {error}");
                ExitCode::from(2)
            }
        },
        ShadowCommand::Promote { name, config_dir } => match promote(config_dir, name) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("verwalter shadow promote: {error}");
                ExitCode::FAILURE
            }
        },
    }
}

/// The latest runs, printed, and whether every one was identical.
fn diff(url: &str, only: Option<&str>) -> Result<(String, bool), String> {
    let list = get_json(url, "/v1/shadow")?;
    let shadows = list["shadows"].as_array().cloned().unwrap_or_default();
    let mut out = String::new();
    for problem in list["problems"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "problem: {}\n",
            problem.as_str().unwrap_or_default()
        ));
    }
    let chosen: Vec<&Value> = shadows
        .iter()
        .filter(|s| only.is_none_or(|n| s["name"] == n))
        .collect();
    if chosen.is_empty() {
        return Err(match only {
            Some(name) => format!("{url} has no shadow scheduler {name:?}"),
            None => format!("{url} has no shadow schedulers (scheduler/shadow.yaml)"),
        });
    }
    let mut same = true;
    for shadow in chosen {
        let name = shadow["name"].as_str().unwrap_or_default();
        let Some(id) = shadow["latest"]["run"].as_u64() else {
            out.push_str(&format!("shadow {name}: no run yet\n"));
            continue;
        };
        let run = get_json(url, &format!("/v1/shadow/{name}/runs/{id}"))?;
        same &= run["result"] == "identical";
        out.push_str(&describe(&run));
    }
    Ok((out, same))
}

/// One run, readably.
pub(crate) fn describe(run: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut out = format!(
        "shadow {}, run {} at {} (input {}, real schedule {}): ",
        text(&run["shadow"]),
        run["run"],
        text(&run["time_rfc3339"]),
        short(&run["input_hash"]),
        short(&run["real_hash"]),
    );
    match run["result"].as_str().unwrap_or_default() {
        "identical" => out.push_str("identical to the real schedule\n"),
        "differs" => out.push_str(&format!(
            "differs from the real schedule in {} paths\n",
            run["paths_differing"]
        )),
        "real_failed" => out.push_str(&format!(
            "made a schedule; the real run failed: {}\n",
            text(&run["real_error"])
        )),
        "failed" => out.push_str(&format!(
            "failed ({}): {}\n",
            text(&run["error"]["kind"]),
            text(&run["error"]["message"])
        )),
        "skipped" => out.push_str(&format!(
            "skipped, still busy with run {}\n",
            run["skipped"]["busy_with"]
        )),
        other => out.push_str(&format!("{other}\n")),
    }
    let diff = &run["diff"];
    for part in ["roles", "nodes"] {
        for kind in ["added", "removed", "changed"] {
            let names: Vec<String> = diff[part][kind]
                .as_array()
                .into_iter()
                .flatten()
                .map(&text)
                .collect();
            if !names.is_empty() {
                out.push_str(&format!("  {part} {kind}: {}\n", names.join(", ")));
            }
        }
    }
    for change in diff["changes"].as_array().into_iter().flatten() {
        let path = text(&change["path"]);
        let line = match change["kind"].as_str().unwrap_or_default() {
            "added" => format!("  + {path}: {}\n", change["shadow"]),
            "removed" => format!("  - {path}: {}\n", change["real"]),
            _ => format!("  ~ {path}: {} -> {}\n", change["real"], change["shadow"]),
        };
        out.push_str(&line);
    }
    if diff["truncated"] == true {
        out.push_str("  ... (more paths differ than are listed)\n");
    }
    out
}

/// The first 12 characters of a hash.
fn short(hash: &Value) -> String {
    hash.as_str()
        .map_or_else(|| "-".to_string(), |h| h.chars().take(12).collect())
}

/// GET `path` of `url` (`http://host[:port]`) as JSON.
fn get_json(url: &str, path: &str) -> Result<Value, String> {
    let authority = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// addresses are taken"))?
        .trim_end_matches('/');
    let address = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let wait = Duration::from_secs(10);
    let fail = |e: std::io::Error| format!("{url}{path}: {e}");
    let mut stream = TcpStream::connect(&address).map_err(fail)?;
    stream.set_read_timeout(Some(wait)).map_err(fail)?;
    stream.set_write_timeout(Some(wait)).map_err(fail)?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json\r\n\r\n"
    )
    .map_err(fail)?;
    let mut response = Vec::new();
    stream
        .take(256 << 20)
        .read_to_end(&mut response)
        .map_err(fail)?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{url}{path}: not an HTTP answer"))?;
    let code = head.split_whitespace().nth(1).unwrap_or_default();
    if code != "200" {
        return Err(format!("{url}{path}: {code} {}", body.trim()));
    }
    serde_json::from_str(body).map_err(|e| format!("{url}{path}: not JSON: {e}"))
}

/// Makes `scheduler/<name>` of `config_dir` the scheduler in force; what it did, to print.
fn promote(config_dir: &Path, name: &str) -> Result<String, String> {
    let scheduler = config_dir.join("scheduler");
    if !crate::config::is_frontend_name(name) {
        return Err(format!("{name:?} is not a dir name under scheduler/"));
    }
    if name == "v1" {
        return Err("v1 is the scheduler in force already".into());
    }
    let shadow = scheduler.join(name);
    if !shadow.join("main.lua").is_file()
        && !shadow.join(crate::schedule::wasm::SCHEDULER_WASM).is_file()
    {
        return Err(format!(
            "{} has neither main.lua nor scheduler.wasm",
            shadow.display()
        ));
    }
    let stamp = time::OffsetDateTime::now_utc()
        .format(time::macros::format_description!(
            "[year][month][day]T[hour][minute][second]Z"
        ))
        .map_err(|e| e.to_string())?;
    let aside_name = format!("v1-replaced-{stamp}");
    let aside = scheduler.join(&aside_name);
    if aside.exists() {
        return Err(format!("{} exists; try again in a second", aside.display()));
    }
    let v1 = scheduler.join("v1");
    let mut out = String::new();
    if v1.exists() {
        // One step for a running daemon: the two dirs swap places at once (no moment without a
        // v1), then the old v1 goes aside.
        swap(&shadow, &v1)?;
        std::fs::rename(&shadow, &aside)
            .map_err(|e| format!("{} -> {}: {e}", shadow.display(), aside.display()))?;
        out.push_str(&format!("scheduler/v1 kept as scheduler/{aside_name}\n"));
    } else {
        std::fs::rename(&shadow, &v1)
            .map_err(|e| format!("{} -> {}: {e}", shadow.display(), v1.display()))?;
    }
    out.push_str(&format!("scheduler/{name} is now scheduler/v1\n"));
    if let Some(line) = drop_from_shadow_file(config_dir, name)? {
        out.push_str(&line);
    }
    Ok(out)
}

/// Swaps two dirs in one step (`renameat2` with `RENAME_EXCHANGE`), or, where the file system
/// cannot, by three renames.
fn swap(a: &Path, b: &Path) -> Result<(), String> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    match renameat2(AT_FDCWD, a, AT_FDCWD, b, RenameFlags::RENAME_EXCHANGE) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => {
            let tmp = a.with_extension("swap~");
            let step = |from: &Path, to: &Path| {
                std::fs::rename(from, to)
                    .map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))
            };
            step(a, &tmp)?;
            step(b, a)?;
            step(&tmp, b)
        }
        Err(e) => Err(format!("{} <-> {}: {e}", a.display(), b.display())),
    }
}

/// Takes `name` out of `scheduler/shadow.yaml`'s `shadows` (the file is written anew: its
/// comments are not kept); what it did, to print.
fn drop_from_shadow_file(config_dir: &Path, name: &str) -> Result<Option<String>, String> {
    let path = config_dir.join(SHADOW_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let Ok(mut file) = serde_norway::from_str::<serde_norway::Mapping>(&text) else {
        return Ok(Some(format!(
            "{SHADOW_FILE} does not parse; take {name} out of it by hand\n"
        )));
    };
    let key = serde_norway::Value::from("shadows");
    let Some(serde_norway::Value::Sequence(list)) = file.get_mut(&key) else {
        return Ok(None);
    };
    let before = list.len();
    list.retain(|v| v.as_str() != Some(name));
    if list.len() == before {
        return Ok(None);
    }
    let text = serde_norway::to_string(&file).map_err(|e| e.to_string())?;
    crate::storage::state_dir::write_atomic(&path, text.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(format!("{name} taken out of {SHADOW_FILE}\n")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_run_reads_as_its_result_and_each_change() {
        let run = json!({
            "shadow": "v2", "run": 7, "time_rfc3339": "2026-11-27T22:40:11Z",
            "input_hash": "6c030017e91a325602a2", "real_hash": "cc054e12636cdd2f931a",
            "result": "differs", "paths_differing": 3,
            "diff": {
                "roles": {"added": ["db"], "removed": [], "changed": ["web"]},
                "nodes": {"added": [], "removed": [], "changed": []},
                "changes": [
                    {"path": "roles.db", "kind": "added", "shadow": {"v": 1}},
                    {"path": "roles.old", "kind": "removed", "real": 1},
                    {"path": "roles.web.version", "kind": "changed", "real": "v1", "shadow": "v2"}
                ],
                "truncated": false
            }
        });
        assert_eq!(
            describe(&run),
            "shadow v2, run 7 at 2026-11-27T22:40:11Z (input 6c030017e91a, real schedule cc054e12636c): differs from the real schedule in 3 paths\n  \
             roles added: db\n  roles changed: web\n  \
             + roles.db: {\"v\":1}\n  - roles.old: 1\n  ~ roles.web.version: \"v1\" -> \"v2\"\n"
        );
        let failed = json!({
            "shadow": "loop", "run": 8, "time_rfc3339": "t", "input_hash": "i", "real_hash": null,
            "result": "failed", "error": {"kind": "timeout", "message": "too slow"}, "diff": null
        });
        assert_eq!(
            describe(&failed),
            "shadow loop, run 8 at t (input i, real schedule -): failed (timeout): too slow\n"
        );
    }
}
