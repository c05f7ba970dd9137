//! A stand-in for lithos's `lithos_switch`, for trying examples/lithos without lithos.
//!
//! **This is a test double, not lithos.** It offers the same command-line interface as
//! `lithos_switch [--master FILE] <sandbox> <new_config_file>` and refuses the processes configs
//! lithos would refuse, but it starts and stops nothing:
//!
//! 1. `<new_config_file>` must be a lithos processes config: a mapping of process name to
//!    `{kind: Daemon|Command (default Daemon), image, config, instances (unsigned, default 1),
//!    variables: {name: string}, extra-secrets-namespaces: [..], ip-addresses: [..]}`, `image`
//!    and `config` required, no other keys. An empty file is an empty config (no processes).
//! 2. The file is installed as `$LITHOS_ROOT/processes/<sandbox>.yaml` atomically: written to a
//!    temp file in that directory, then renamed over the old one. (The real one then sends
//!    SIGQUIT to lithos_tree, which restarts the sandbox's processes to match; there is no
//!    lithos_tree here.)
//! 3. Every call with a sandbox and a file, installed or refused, appends one line
//!    `<time> <sandbox> ok` or `<time> <sandbox> error: <message>` to `$LITHOS_ROOT/calls.log`.
//!
//! `LITHOS_ROOT` defaults to `/tmp/lithos-example`. `--master` is accepted and ignored. Exit
//! status: 0 installed, 1 refused or failed, 2 bad command line.
//!
//! Build it with `cargo build -p lithos-switch` (a crate of its own, see its Cargo.toml); it lands
//! in `target/debug/`.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Deserialize;

const DEFAULT_ROOT: &str = "/tmp/lithos-example";
const USAGE: &str = "usage: lithos_switch [--master FILE] <sandbox> <new_config_file>";

/// One entry of a processes config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
#[allow(dead_code)] // Parsed to be checked; the stand-in runs nothing.
struct Process {
    #[serde(default)]
    kind: Kind,
    image: String,
    config: String,
    #[serde(default = "one")]
    instances: u32,
    #[serde(default)]
    variables: BTreeMap<String, String>,
    #[serde(default)]
    extra_secrets_namespaces: Vec<String>,
    #[serde(default)]
    ip_addresses: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
enum Kind {
    #[default]
    Daemon,
    Command,
}

fn one() -> u32 {
    1
}

/// Why a call failed: the message, and the exit status.
struct Failure(String, u8);

fn main() -> ExitCode {
    let root = std::env::var_os("LITHOS_ROOT")
        .filter(|r| !r.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_ROOT), PathBuf::from);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (sandbox, result) = match parse_args(&args) {
        Ok((sandbox, file)) => {
            let result = switch(&root, &sandbox, Path::new(&file));
            (sandbox, result)
        }
        Err(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(Some(message)) => {
            eprintln!("lithos_switch: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let outcome = match &result {
        Ok(()) => "ok".to_string(),
        Err(Failure(message, _)) => format!("error: {}", one_line(message)),
    };
    if let Err(e) = log_call(&root, &sandbox, &outcome) {
        eprintln!(
            "lithos_switch: {}: cannot append: {e}",
            root.join("calls.log").display()
        );
    }
    match result {
        Ok(()) => {
            println!(
                "lithos_switch: installed {} for sandbox {sandbox}",
                root.join("processes")
                    .join(format!("{sandbox}.yaml"))
                    .display()
            );
            ExitCode::SUCCESS
        }
        Err(Failure(message, status)) => {
            eprintln!("lithos_switch: {message}");
            ExitCode::from(status)
        }
    }
}

/// `[--master FILE] <sandbox> <file>` -> (sandbox, file); `Err(None)` for `--help`.
fn parse_args(args: &[String]) -> Result<(String, String), Option<String>> {
    let mut positional = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--master" => {
                iter.next().ok_or("--master needs a file".to_string())?;
            }
            "-h" | "--help" => return Err(None),
            other if other.starts_with("--master=") => {}
            other if other.starts_with('-') && other.len() > 1 => {
                return Err(Some(format!("unknown option {other}")));
            }
            other => positional.push(other.to_string()),
        }
    }
    match <[String; 2]>::try_from(positional) {
        Ok([sandbox, file]) => Ok((sandbox, file)),
        Err(p) => Err(Some(format!("expected 2 arguments, got {}", p.len()))),
    }
}

fn switch(root: &Path, sandbox: &str, file: &Path) -> Result<(), Failure> {
    check_sandbox_name(sandbox).map_err(|e| Failure(format!("sandbox {sandbox:?}: {e}"), 1))?;
    let text = fs::read_to_string(file)
        .map_err(|e| Failure(format!("{}: cannot read: {e}", file.display()), 1))?;
    let processes = parse(&text).map_err(|e| {
        Failure(
            format!(
                "{}: not a valid lithos processes config: {e}",
                file.display()
            ),
            1,
        )
    })?;
    let dir = root.join("processes");
    let target = dir.join(format!("{sandbox}.yaml"));
    install(&dir, &target, text.as_bytes())
        .map_err(|e| Failure(format!("{}: cannot install: {e}", target.display()), 1))?;
    let instances: u32 = processes.values().map(|p| p.instances).sum();
    println!(
        "lithos_switch: {} process(es), {instances} instance(s) in total",
        processes.len()
    );
    Ok(())
}

/// A sandbox name names a file in the processes dir: a plain, visible file name.
fn check_sandbox_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("must not be empty")
    } else if name.contains('/') {
        Err("must not contain `/`")
    } else if name.starts_with('.') {
        Err("must not start with `.`")
    } else if name.chars().any(char::is_control) {
        Err("must not contain control characters")
    } else {
        Ok(())
    }
}

/// The config, checked as lithos checks it.
fn parse(text: &str) -> Result<BTreeMap<String, Process>, String> {
    // An empty document (nothing but comments) is null: no processes.
    let parsed: Option<BTreeMap<String, Process>> =
        serde_norway::from_str(text).map_err(|e| e.to_string())?;
    let processes = parsed.unwrap_or_default();
    for (name, process) in &processes {
        if name.is_empty() {
            return Err("a process name must not be empty".into());
        }
        if !process.ip_addresses.is_empty()
            && process.ip_addresses.len() != process.instances as usize
        {
            return Err(format!(
                "{name}: {} ip-addresses for {} instance(s); there must be one per instance",
                process.ip_addresses.len(),
                process.instances
            ));
        }
    }
    Ok(processes)
}

/// Writes `bytes` to a temp file in `dir`, then renames it to `target`: readers see the old
/// file or the new one, never a part.
fn install(dir: &Path, target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp.")
        .suffix(".yaml")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(0o644))?;
    tmp.as_file().sync_all()?;
    tmp.persist(target).map_err(|e| e.error)?;
    Ok(())
}

/// Appends `<time> <sandbox> <outcome>` to `root/calls.log` in one write.
fn log_call(root: &Path, sandbox: &str, outcome: &str) -> std::io::Result<()> {
    fs::create_dir_all(root)?;
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "-".into());
    let shown =
        if sandbox.is_empty() || sandbox.chars().any(|c| c.is_whitespace() || c.is_control()) {
            format!("{sandbox:?}")
        } else {
            sandbox.to_string()
        };
    let line = format!("{now} {shown} {outcome}\n");
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("calls.log"))?
        .write_all(line.as_bytes())
}

/// The message on one line, for the log.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}
