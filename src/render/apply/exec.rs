//! Runs one process for `!Cmd`, `!Sh` and `!RootCommand`: output into the log, a time limit,
//! and on timeout the end of its whole process group.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::time::{Instant, sleep_until, timeout};

use super::expand::show_argv;
use super::{ApplyLog, At, CommandError};

/// After the process exits, how long its output pipes may stay open before we stop reading. A
/// background process it started (a daemon that kept our stdout) must not hold the deployment
/// until the timeout; whatever the exited process wrote is in the pipe by then.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);

/// Between SIGTERM and SIGKILL on timeout. SIGTERM first because `sudo` passes it on to the root
/// command it runs, which we are not allowed to signal ourselves; SIGKILL would leave that one.
pub(crate) const TERM_GRACE: Duration = Duration::from_secs(2);

/// What systemd tells the daemon, not meant for the commands: a command that sent `READY=1` or
/// `WATCHDOG=1` to the daemon's socket would speak for the daemon.
const SERVICE_MANAGER_VARS: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// Runs `argv` (not empty), its output going to `log`, within `limit`.
pub(crate) async fn run(
    argv: &[String],
    at: At,
    limit: Duration,
    log: &mut dyn ApplyLog,
) -> Result<(), CommandError> {
    let program = argv[0].clone();
    log.line(&format!("running: {}", show_argv(argv)));
    let started = std::time::Instant::now();
    // The watchdog's step limit of the pass counts from here: this command is bounded by
    // `limit` and the kill after it.
    verwalter_controllers::machinery::watchdog::mark_step();
    let mut command = tokio::process::Command::new(&argv[0]);
    for name in SERVICE_MANAGER_VARS {
        command.env_remove(name);
    }
    let mut child = command
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so that on timeout the processes it started go with it.
        .process_group(0)
        // Should the deployment be dropped midway, the process does not outlive it.
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CommandError::Spawn {
            at,
            program: program.clone(),
            source,
        })?;
    let pid = child.id().expect("not waited for yet");
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let mut out_buf = vec![0u8; 8192];
    let mut err_buf = vec![0u8; 8192];
    let (mut out_open, mut err_open) = (true, true);
    let (mut out_tail, mut err_tail) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + limit;
    let mut status: Option<ExitStatus> = None;
    let mut drain_until = deadline;
    loop {
        if status.is_some() && !out_open && !err_open {
            break;
        }
        tokio::select! {
            read = stdout.read(&mut out_buf), if out_open => match read {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => {
                    log.output(&out_buf[..n]);
                    keep_tail(&mut out_tail, &out_buf[..n]);
                }
            },
            read = stderr.read(&mut err_buf), if err_open => match read {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => {
                    log.output(&err_buf[..n]);
                    keep_tail(&mut err_tail, &err_buf[..n]);
                }
            },
            exit = child.wait(), if status.is_none() => {
                let exit = exit.map_err(|source| CommandError::Io {
                    at,
                    path: program.clone().into(),
                    action: "wait for the process",
                    source,
                })?;
                status = Some(exit);
                drain_until = deadline.min(Instant::now() + DRAIN_AFTER_EXIT);
            },
            () = sleep_until(drain_until) => break,
        }
    }
    let Some(status) = status else {
        end_group(pid, &mut child).await;
        log.line(&format!("killed after timeout of {limit:?}"));
        return Err(CommandError::Timeout {
            at,
            program,
            timeout: limit,
        });
    };
    if out_open || err_open {
        log.line("output still open after exit (held by a background process); not waiting for it");
    }
    log.line(&format!(
        "{} after {:.3?}",
        describe(status),
        started.elapsed()
    ));
    if status.success() {
        Ok(())
    } else {
        let tail = last_line(if err_tail.iter().any(|b| !b.is_ascii_whitespace()) {
            &err_tail
        } else {
            &out_tail
        });
        Err(CommandError::Failed {
            at,
            program,
            status,
            tail,
        })
    }
}

/// How much of the end of each output stream is kept for the error message.
const TAIL: usize = 1024;

fn keep_tail(tail: &mut Vec<u8>, bytes: &[u8]) {
    tail.extend_from_slice(bytes);
    if tail.len() > TAIL {
        tail.drain(..tail.len() - TAIL);
    }
}

/// The last non-empty line of `bytes` that is not an `sh -x` trace (`+ cmd`), at most 300
/// characters.
fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line = text
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with("+ "))
        .unwrap_or("");
    line.chars().take(300).collect()
}

/// `: <line>` for an error message, or nothing.
pub(crate) fn show_tail(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {tail}")
    }
}

/// Ends the group the child leads: SIGTERM, a grace period for the child, then SIGKILL for any
/// member still there, and the child reaped.
async fn end_group(pid: u32, child: &mut tokio::process::Child) {
    let group = Pid::from_raw(pid as i32);
    // Errors: ESRCH when the group is gone already, which is what we want.
    let _ = killpg(group, Signal::SIGTERM);
    let _ = timeout(TERM_GRACE, child.wait()).await;
    // The group id stays reserved while any member lives, so this reaches no stranger unless
    // all members are gone and the id was reused within these microseconds.
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.start_kill();
    unkillable_for_tests().await;
    let _ = child.wait().await;
}

/// A fault switch for the watchdog's integration test (`tests/notify.rs`), only in debug builds:
/// with `VERWALTER_TEST_UNKILLABLE` set, a command killed after its timeout is never reaped, as
/// happens for real to a process stuck in uninterruptible sleep (a dead NFS mount): SIGKILL
/// does not end it, and the render pass waits forever. No test can make a process unkillable
/// without root and a broken file system, and every other wait in a pass has a bound, so this
/// is the honest way to get a hung controller in a test. Release builds have no such switch.
async fn unkillable_for_tests() {
    #[cfg(debug_assertions)]
    if std::env::var_os("VERWALTER_TEST_UNKILLABLE").is_some() {
        std::future::pending::<()>().await;
    }
}

/// `exited with status 3`, `killed by signal 9 (SIGKILL)`.
pub(crate) fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    match status.signal() {
        Some(signal) => match Signal::try_from(signal) {
            Ok(name) => format!("killed by signal {signal} ({name})"),
            Err(_) => format!("killed by signal {signal}"),
        },
        None => format!("ended with {status}"),
    }
}
