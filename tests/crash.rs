//! Crash trials (issue 15): the daemon is killed with SIGKILL at random moments while schedules
//! change and roles render, then restarted on the same dirs. After every kill, before the
//! restart, every rendered file is whole (never half of one version, never a mix of two) and
//! the storage dir's schedule and backups are whole (an applied hash cut short only renders its
//! role again, by design); after the restart no
//! schedule is lost (the one in force is the latest the config dir gives), every role converges
//! on it with no failure left, no temp file of an interrupted write is left beside the rendered
//! files, and the deployment log's index goes on with whole lines.
//!
//! "Random moments" are chosen by what the daemon reports: a trial kills it once a random number
//! of role applies (0 to all of them) have been recorded after the new schedule was written, so
//! kills land before the schedule is taken, between roles, and in the middle of apply commands.
//! The choice comes from a seeded generator: `CRASH_SEED` replays a run, `CRASH_TRIALS` sets the
//! number of trials (10 by default; `make crash-trials` runs 1,000).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::util::*;

const SOON: Duration = Duration::from_secs(30);
const ROLES: usize = 6;

/// The scheduler: the schedule is whatever `runtime/schedule.json` says.
const PASSTHROUGH: &str = "return {scheduler = function(state)\n  \
    return state.runtime.schedule or {}, 'passthrough'\nend}\n";

struct Site {
    _tmp: tempfile::TempDir,
    config: PathBuf,
    storage: PathBuf,
    out: PathBuf,
}

impl Site {
    fn new() -> Site {
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("config");
        let storage = tmp.path().join("storage");
        let out = tmp.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        replace_file(&config.join("scheduler/v1/main.lua"), PASSTHROUGH);
        let o = out.display();
        // Each role's file: a header and a footer naming its version around 64 KiB of filler,
        // so a torn write would show; copied into out/, then the apply is recorded.
        replace_file(
            &config.join("templates/crash/v1/crash.render.yaml"),
            &format!(
                "templates:\n  conf: crash.conf.hbs\ncommands:\n\
                 - !Copy {{src: '{{{{ files.conf }}}}', dest: '{o}/{{{{ role }}}}.conf'}}\n\
                 - !Sh 'echo {{{{ role }}}} >> {o}/calls.log'\n"
            ),
        );
        replace_file(
            &config.join("templates/crash/v1/crash.conf.hbs"),
            "BEGIN {{role}} v={{version}}\n{{filler}}\nEND {{role}} v={{version}}\n",
        );
        Site {
            _tmp: tmp,
            config,
            storage,
            out,
        }
    }

    fn start(&self) -> Daemon {
        Daemon::start(&self.config, &self.storage)
    }

    /// Puts schedule `version` in the config dir: every role at that version, `r1` depending
    /// on `r0` (so that gating is crossed by kills too).
    fn write_schedule(&self, version: u64) -> Value {
        let mut roles = serde_json::Map::new();
        for i in 0..ROLES {
            let mut role = json!({"template": "crash/v1", "version": version});
            if i == 1 {
                role["depends_on"] = json!(["r0"]);
            }
            roles.insert(format!("r{i}"), role);
        }
        let data = json!({
            "vars": {"filler": "x".repeat(64 * 1024)},
            "nodes": {"alpha": {"roles": roles}},
        });
        replace_file(
            &self.config.join("runtime/schedule.json"),
            &data.to_string(),
        );
        data
    }

    fn calls(&self) -> usize {
        std::fs::read_to_string(self.out.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// Every rendered file is one whole version, not above `latest`: `(role, version)`.
    fn check_files(&self, latest: u64, trial: &str) -> Vec<(String, u64)> {
        let mut seen = Vec::new();
        for entry in std::fs::read_dir(&self.out).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            // The temp file of a write the kill interrupted: hidden, and replaced by the role's
            // next apply (checked in `converged`).
            if name.starts_with(".tmp.") {
                continue;
            }
            let Some(role) = name.strip_suffix(".conf") else {
                continue;
            };
            let text = std::fs::read_to_string(&path).unwrap();
            let mut lines = text.lines();
            let head = lines.next().unwrap_or_default();
            let tail = text.lines().last().unwrap_or_default();
            let version: u64 = head
                .strip_prefix(&format!("BEGIN {role} v="))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{trial}: {name} is torn: starts {head:?}"));
            assert_eq!(
                tail,
                format!("END {role} v={version}"),
                "{trial}: {name} is torn ({} bytes)",
                text.len()
            );
            assert_eq!(
                text.len(),
                64 * 1024 + format!("BEGIN {role} v={version}\n\nEND {role} v={version}\n").len(),
                "{trial}: {name} has the wrong size"
            );
            assert!(version <= latest, "{trial}: {name} is from the future");
            seen.push((role.to_string(), version));
        }
        seen
    }

    /// The storage dir after a kill: the schedule in force and every backup are whole JSON,
    /// and every line of the deployment log's index is whole JSON
    /// except at most a last line without its newline (a record the kill cut short; see
    /// [`Site::check_index`]). Returns how many index files end in such a line, and how many
    /// applied hashes the kill cut short.
    fn check_storage(&self, trial: &str) -> (usize, usize) {
        let schedule = self.storage.join("schedule/schedule.json");
        let backups = files_under(&self.storage.join("backups"));
        let temp = |f: &PathBuf| f.file_name().unwrap().to_string_lossy().starts_with(".tmp");
        for file in std::iter::once(&schedule)
            .chain(backups.iter().filter(|f| !temp(f)))
            .filter(|f| f.exists())
        {
            let mut text = std::fs::read(file).unwrap();
            if file.starts_with(self.storage.join("backups")) {
                // Backups are gzipped copies of schedule.json.
                let mut plain = Vec::new();
                let read = std::io::Read::read_to_end(
                    &mut flate2::read::GzDecoder::new(&text[..]),
                    &mut plain,
                );
                assert!(
                    read.is_ok(),
                    "{trial}: {} is not whole gzip",
                    file.display()
                );
                text = plain;
            }
            assert!(
                serde_json::from_slice::<Value>(&text).is_ok(),
                "{trial}: {} is not whole JSON ({} bytes)",
                file.display(),
                text.len()
            );
        }
        // An applied hash is rewritten in place without fsync, by design (src/storage/state_dir.rs): a
        // kill may leave it empty or torn, which only makes that role render once more (checked
        // by the convergence after the restart). Counted, not refused.
        let cut_hashes = files_under(&self.storage.join("roles"))
            .iter()
            .filter(|file| {
                let text = std::fs::read_to_string(file).unwrap_or_default();
                let hash = text.trim();
                !(hash.len() == 40 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
            })
            .count();
        (self.check_index(trial, true), cut_hashes)
    }

    /// Every complete line (ending in a newline) of the deployment log's index files is JSON;
    /// with `allow_torn_tail`, a last line without a newline is counted instead of refused.
    fn check_index(&self, trial: &str, allow_torn_tail: bool) -> usize {
        let mut torn = 0;
        for file in files_under(&self.storage.join("log/.index")) {
            let text = std::fs::read_to_string(&file).unwrap();
            let (complete, tail) = match text.rfind('\n') {
                Some(end) => (&text[..end], &text[end + 1..]),
                None => ("", text.as_str()),
            };
            for line in complete.lines() {
                assert!(
                    serde_json::from_str::<Value>(line).is_ok(),
                    "{trial}: {} has a broken line: {line:?}",
                    file.display()
                );
            }
            if !tail.is_empty() {
                assert!(
                    allow_torn_tail,
                    "{trial}: {} ends in a line without its newline: {tail:?}",
                    file.display()
                );
                torn += 1;
            }
        }
        torn
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Waits until the daemon serves `data` as its schedule and every role applied `version` with
/// nothing failing or held back.
fn converged(site: &Site, daemon: &Daemon, data: &Value, version: u64, trial: &str) {
    daemon.wait_json(
        SOON,
        "/v1/schedule",
        &format!("{trial}: the schedule in force is not the latest"),
        |s| s["data"] == *data,
    );
    let done = wait_for(SOON, || {
        let files = site.check_files(version, trial);
        let all = files.len() == ROLES && files.iter().all(|(_, v)| *v == version);
        let litter = std::fs::read_dir(&site.out)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".tmp."));
        let status = daemon.json("/v1/status")?;
        // (No deployment may be needed: the roles may all have applied before the kill.)
        let pass_over =
            status["last_deployment"].is_null() || status["last_deployment"]["finished"].is_u64();
        (all && !litter
            && status["failed_roles"] == json!([])
            && status["blocked_roles"] == json!({})
            && pass_over)
            .then_some(())
    });
    assert!(
        done.is_some(),
        "{trial}: roles did not converge on v{version}: files {:?}, status {}\n{}",
        site.check_files(version, trial),
        daemon.json("/v1/status").unwrap_or_default(),
        daemon.logs()
    );
}

/// How many kills a trial makes (`CRASH_TRIALS`, 10), the seed (`CRASH_SEED`, 15, named in the
/// messages so that a failing run can be repeated) and the random moments' generator.
fn trials_and_rng() -> (u64, u64, SmallRng) {
    let trials: u64 = std::env::var("CRASH_TRIALS")
        .map(|n| n.parse().expect("CRASH_TRIALS is a number"))
        .unwrap_or(10);
    let seed: u64 = std::env::var("CRASH_SEED")
        .map(|n| n.parse().expect("CRASH_SEED is a number"))
        .unwrap_or(15);
    (trials, seed, SmallRng::seed_from_u64(seed))
}

#[test]
fn killed_at_random_moments_the_daemon_leaves_whole_files_and_converges_after_restart() {
    let (trials, seed, mut rng) = trials_and_rng();
    let site = Site::new();
    let data = site.write_schedule(0);
    let mut daemon = site.start();
    converged(&site, &daemon, &data, 0, "first start");
    let mut kills_by_point = vec![0u32; ROLES + 1];
    let (mut torn_tails, mut cut_hashes) = (0, 0);
    for version in 1..=trials {
        let trial = format!("seed {seed}, trial {version}");
        let before = site.calls();
        let data = site.write_schedule(version);
        // Kill once `point` roles applied this version (0: right after the config changed).
        let point = rng.random_range(0..=ROLES);
        kills_by_point[point] += 1;
        if point > 0 {
            let reached = wait_for(SOON, || (site.calls() >= before + point).then_some(()));
            assert!(
                reached.is_some(),
                "{trial}: {point} applies never came\n{}",
                daemon.logs()
            );
        }
        daemon.child.kill().unwrap();
        daemon.child.wait().unwrap();
        site.check_files(version, &trial);
        let (tails, hashes) = site.check_storage(&trial);
        torn_tails += tails;
        cut_hashes += hashes;
        daemon = site.start();
        converged(&site, &daemon, &data, version, &trial);
        // What the restarted daemon appended starts on a line of its own.
        site.check_index(&trial, false);
    }
    eprintln!(
        "crash trials: {trials} kills (seed {seed}), by roles applied before the kill: \
         {kills_by_point:?}; 0 torn files, 0 lost schedules, every role converged; \
         {torn_tails} index records and {cut_hashes} applied hashes cut short by a kill, \
         the records closed by the restart, the roles rendered again"
    );
}

/// The `hash=` of each log line containing `message`, in order.
fn logged_hashes(log: &str, message: &str) -> Vec<String> {
    log.lines()
        .filter(|line| line.contains(message))
        .filter_map(|line| {
            let at = line.find(" hash=")? + " hash=".len();
            Some(line[at..].split_whitespace().next()?.to_string())
        })
        .collect()
}

/// The hashes of the schedules the daemon took, in order: each is logged before it is saved.
fn taken_hashes(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("New schedule.") || l.contains("Restamped the schedule."))
        .flat_map(|l| logged_hashes(l, "schedule."))
        .collect()
}

/// Schedules streamed into a running daemon, each new version written as soon as the one
/// before is taken, and the daemon killed with SIGKILL as soon as a random number of them have
/// been taken (the log polled every 0.2 ms, so kills land in the save that follows the log line
/// as well as after it). A schedule is logged as taken before it is saved: after each kill the
/// start loads the last one logged or the one before it (its save cut short), never another,
/// never an error; it rewrites `schedule.json` from it, and serves the latest version after
/// its first round. The slots and `schedule.json` are checked after each kill: `schedule.json`
/// whole JSON, every slot whole or the one being written (the start passes over it).
#[test]
fn killed_in_a_stream_of_rounds_the_start_loads_the_newest_schedule_or_the_one_before() {
    let (trials, seed, mut rng) = trials_and_rng();
    let site = Site::new();
    let mut version = 0;
    let mut data = site.write_schedule(version);
    let mut daemon = site.start();
    converged(&site, &daemon, &data, version, "first start");
    let (mut newest, mut before, mut torn_slots) = (0, 0, 0);
    // The schedule the running daemon loaded at its start: the one before the first it takes
    // (a start whose first round makes the schedule it loaded logs no new one).
    let mut loaded_at_start: Option<String> = None;
    for trial in 1..=trials {
        let trial = format!("seed {seed}, stream trial {trial}");
        let rounds = rng.random_range(1..=4);
        let start = taken_hashes(&daemon.logs()).len();
        for round in 1..=rounds {
            version += 1;
            data = site.write_schedule(version);
            let deadline = std::time::Instant::now() + SOON;
            while taken_hashes(&daemon.logs()).len() < start + round {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{trial}: version {version} never taken\n{}",
                    daemon.logs()
                );
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        daemon.child.kill().unwrap();
        daemon.child.wait().unwrap();
        let taken = taken_hashes(&daemon.logs());
        site.check_storage(&trial);
        for slot in ["schedule.slot0", "schedule.slot1"] {
            let path = site.storage.join(slot);
            let bytes = std::fs::read(&path).unwrap_or_default();
            // A whole slot holds an envelope after its 32-byte header; a torn one is counted.
            let body = bytes.get(32..).and_then(|b| {
                let len = u64::from_le_bytes(bytes[16..24].try_into().ok()?) as usize;
                serde_json::from_slice::<Value>(b.get(..len)?).ok()
            });
            if body.is_none() {
                torn_slots += 1;
            }
        }
        daemon = site.start();
        let logs = daemon.logs();
        assert!(
            !logs.contains("Cannot use the stored schedule"),
            "{trial}: {logs}"
        );
        let loaded = logged_hashes(&logs, "Loaded the stored schedule.");
        let [loaded] = loaded.as_slice() else {
            panic!("{trial}: no schedule loaded\n{logs}");
        };
        let last = taken.last().expect("taken since the start");
        let previous = match taken.len() {
            1 => loaded_at_start
                .as_ref()
                .expect("a restarted daemon loaded a schedule"),
            n => &taken[n - 2],
        };
        if loaded == last {
            newest += 1;
        } else {
            assert_eq!(
                loaded, previous,
                "{trial}: loaded neither the last schedule taken nor the one before: {taken:?}"
            );
            before += 1;
        }
        loaded_at_start = Some(loaded.clone());
        // Then the stream goes on from the latest version, and schedule.json keeps up.
        let served = daemon.wait_json(SOON, "/v1/schedule", &format!("{trial}: latest"), |s| {
            s["data"] == data
        });
        let stored = site.storage.join("schedule/schedule.json");
        wait_for(SOON, || {
            let text = std::fs::read_to_string(&stored).ok()?;
            let value: Value = serde_json::from_str(&text).ok()?;
            (value["hash"] == served["hash"]).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "{trial}: schedule.json not the one served\n{}",
                daemon.logs()
            )
        });
    }
    eprintln!(
        "stream crash trials: {trials} kills (seed {seed}); the start loaded the last schedule \
         taken {newest} times, the one before {before} times (killed before its save wrote \
         its slot), never another; {torn_slots} slots found not whole after a kill"
    );
}

/// Runs `args` inside the daemon's mount namespace (where its storage dir is a small tmpfs).
fn in_daemon_namespace(daemon: &Daemon, args: &[&str]) -> std::process::Output {
    std::process::Command::new("nsenter")
        .args(["-t", &daemon.child.id().to_string(), "-m", "--"])
        .args(args)
        .output()
        .unwrap()
}

fn conf_version(site: &Site, role: &str) -> Option<u64> {
    let text = std::fs::read_to_string(site.out.join(format!("{role}.conf"))).ok()?;
    text.lines()
        .next()?
        .strip_prefix(&format!("BEGIN {role} v="))?
        .parse()
        .ok()
}

/// Waits until `/v1/status` satisfies `ready`, or panics with `what` and the log.
fn wait_status(daemon: &Daemon, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    daemon.wait_json(SOON, "/v1/status", what, ready)
}

/// The storage dir full, then read-only, under a running daemon: it goes on serving the
/// schedule it has, shows each problem (status errors, failing roles, the metric) and recovers
/// on its own once the disk is usable again, with nothing lost. The storage dir is a 4 MiB tmpfs in
/// a mount namespace of the daemon's own (`unshare -m`, so root is needed; the test says so and
/// does nothing elsewhere); the test fills it and makes its dirs read-only through `nsenter`.
#[test]
fn a_full_or_read_only_storage_dir_is_reported_and_survived() {
    let probe = std::process::Command::new("unshare")
        .args(["-m", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: mount namespaces (unshare -m) need root here");
        return;
    }
    let site = Site::new();
    std::fs::create_dir_all(&site.storage).unwrap();
    let data = site.write_schedule(1);
    let mut command = std::process::Command::new("unshare");
    command.args([
        "-m",
        "sh",
        "-c",
        "mount -t tmpfs -o size=4m,mode=0700 tmpfs \"$STORAGE\" && exec \"$0\" \"$@\"",
        BIN,
    ]);
    command.env("STORAGE", &site.storage);
    let daemon = Daemon::spawn(command, &site.config, &site.storage, &[], &[]);
    converged(&site, &daemon, &data, 1, "first start on the tmpfs");
    let storage = site.storage.to_string_lossy().into_owned();
    let fill = format!("{storage}/fill");

    // Full: a new schedule is taken and served but cannot be stored, and the deployment log
    // cannot be written: both are shown, and the roles still apply (their staged files and
    // applied hashes reuse space the tmpfs already gave them).
    let full = in_daemon_namespace(
        &daemon,
        &["dd", "if=/dev/zero", &format!("of={fill}"), "bs=64k"],
    );
    assert!(
        String::from_utf8_lossy(&full.stderr).contains("No space left"),
        "{full:?}"
    );
    let data = site.write_schedule(2);
    daemon.wait_json(SOON, "/v1/schedule", "schedule 2 taken", |s| {
        s["data"] == data
    });
    let status = wait_status(&daemon, "the full disk shown", |s| {
        s["errors"]["schedule_persist"].is_string() && s["errors"]["deployment_log"].is_string()
    });
    for error in ["schedule_persist", "deployment_log"] {
        let message = status["errors"][error].as_str().unwrap();
        assert!(
            message.contains("No space left on device"),
            "{error}: {message}"
        );
    }
    let metrics = daemon.get("/metrics").unwrap().1;
    assert!(
        metrics.contains("verwalter_schedule_persist_failing 1"),
        "{metrics}"
    );
    wait_for(SOON, || {
        (conf_version(&site, "r5") == Some(2)).then_some(())
    })
    .expect("the roles apply while the disk is full");

    // Room again: the schedule is stored and the log written, without a restart.
    let freed = in_daemon_namespace(&daemon, &["rm", &fill]);
    assert!(freed.status.success(), "{freed:?}");
    converged(&site, &daemon, &data, 2, "after the disk had room again");
    wait_status(&daemon, "the persist error cleared", |s| {
        s["errors"].get("schedule_persist").is_none()
    });
    // A log stream's error clears when it is written again: at the next deployment, here one
    // the operator asks for (the button "Re-render all roles").
    let port = daemon.port;
    let (code, _) = http_post(port, "/v1/force_render_all", "application/json", b"");
    assert_eq!(code, 200);
    wait_status(&daemon, "the log error cleared", |s| {
        s["errors"].get("deployment_log").is_none()
    });

    // Read-only: nothing can be staged either, so the roles fail, keeping their last good
    // files, and say why; the schedule is served all along.
    // Read-only: the same, with the read-only error shown.
    // (The whole tmpfs cannot be remounted read-only while the daemon holds log files open
    // for writing; the dirs it writes schedules and staged files into are made read-only.)
    let ro_dirs = [format!("{storage}/schedule"), format!("{storage}/staging")];
    for dir in &ro_dirs {
        let script = format!("mount --bind '{dir}' '{dir}' && mount -o remount,bind,ro '{dir}'");
        let ro = in_daemon_namespace(&daemon, &["sh", "-c", &script]);
        assert!(ro.status.success(), "{ro:?}");
    }
    let data = site.write_schedule(3);
    let status = wait_status(&daemon, "the read-only disk shown", |s| {
        s["errors"]["schedule_persist"].is_string() && s["failed_roles"] != json!([])
    });
    let persist = status["errors"]["schedule_persist"].as_str().unwrap();
    assert!(persist.contains("Read-only file system"), "{persist}");
    let failed = status["failed_roles"][0].as_str().unwrap();
    let role_error = status["errors"][format!("role {failed}")].as_str().unwrap();
    assert!(role_error.contains("Read-only file system"), "{role_error}");
    assert_eq!(
        conf_version(&site, failed),
        Some(2),
        "{failed} keeps its last good files"
    );
    daemon.wait_json(SOON, "/v1/schedule", "schedule 3 served", |s| {
        s["data"] == data
    });
    for dir in &ro_dirs {
        let rw = in_daemon_namespace(&daemon, &["umount", dir]);
        assert!(rw.status.success(), "{rw:?}");
    }
    converged(
        &site,
        &daemon,
        &data,
        3,
        "after the disk was writable again",
    );
    wait_status(&daemon, "the disk errors cleared", |s| {
        s["errors"].get("schedule_persist").is_none() && s["errors"].get("deployment_log").is_none()
    });
    // And what it stored is what it serves: a restart comes back with schedule 3.
    let stored = in_daemon_namespace(
        &daemon,
        &["cat", &format!("{storage}/schedule/schedule.json")],
    );
    let stored: Value =
        serde_json::from_slice(&stored.stdout).expect("the stored schedule is JSON");
    assert!(
        stored.to_string().contains("\"version\":3"),
        "the stored schedule is not schedule 3"
    );
}
