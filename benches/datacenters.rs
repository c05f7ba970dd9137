//! Across data centers (issue 35) between real processes: three one-node DCs, `ams`, `fra` and
//! `lon`, each reached by the other two only through its own delaying proxy (`DcProxy` of the
//! tests, `ONE_WAY_MS` each way: a round trip of twice it). Their scheduler publishes a summary
//! of `ROLES` roles whose numbers follow `runtime/churn.json`, and puts the `n` of every other
//! DC's summary it sees in its schedule. Prints:
//!
//! - **latency**: a summary change in one DC (the DCs take turns) → the other two DCs'
//!   schedulers have run on it: from the changing DC's `New schedule.` log line to each other
//!   DC's (the nodes' own microsecond timestamps), p50 and p99 over `TRIALS`;
//! - **bytes per hour**: what each leader sent across DCs (`verwalter_dc_bytes_total` with
//!   `direction="sent"`: the uncompressed JSON the cap counts) over `WINDOW_SECS`, scaled to an
//!   hour, idle and with a summary change in every DC every `CHURN_MS`, beside what the cap
//!   allows in an hour.
//!
//! Run: `cargo bench --bench datacenters` (TRIALS=20, ONE_WAY_MS=50, ROLES=100, WINDOW_SECS=60,
//! CHURN_MS=10000; CAP sets `datacenters.traffic-cap-bytes`, 4194304 by default, per
//! INTERVAL_MS, `datacenters.traffic-interval-ms`, 60000 by default; the daemon refuses a cap
//! under twice the heartbeats' floor, 152880 a minute with two other DCs). A window should span
//! many intervals: bodies go out at the start of each interval until the cap, so a window of
//! one interval may hold two intervals' bursts.

#[allow(dead_code, unused_imports)]
#[path = "../tests/util.rs"]
mod util;

#[allow(dead_code, unused_imports)]
#[path = "../tests/dc_proxy.rs"]
mod dc_proxy;
#[path = "support/report.rs"]
mod report;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use dc_proxy::DcProxy;
use report::{ms, report};
use util::{Daemon, metric, wait_for};

const DCS: [&str; 3] = ["ams", "fra", "lon"];
const KEY: &[u8] = b"the key of the data centers benchmark";

/// A summary of `roles` roles whose numbers follow `n` (runtime/churn.json); the schedule names
/// the `n` of every other DC's summary this DC sees.
const SCHEDULER: &str = r#"
local function scheduler(state)
    local churn = state.runtime.churn or {}
    local n = math.tointeger(churn.n) or 0
    local summary = {n = n, roles = {}}
    for i = 1, (math.tointeger(churn.roles) or 100) do
        summary.roles["role-" .. i] = {spare = (i * 7 + n) % 50, load = (i * 13 + n) % 100}
    end
    local seen = {}
    local dcs = state.datacenters or {dcs = {}}
    for name, dc in pairs(dcs.dcs) do
        seen[name] = dc.summary and dc.summary.n or -1
    end
    return {seen = seen, datacenters = {summary = summary}}
end
return {scheduler = scheduler}
"#;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Dc {
    name: &'static str,
    config: PathBuf,
    daemon: Daemon,
    proxy: DcProxy,
}

impl Dc {
    fn set_churn(&self, n: u64, roles: u64) {
        let path = self.config.join("runtime/churn.json");
        let tmp = path.with_extension("tmp~");
        std::fs::write(&tmp, format!("{{\"n\": {n}, \"roles\": {roles}}}")).unwrap();
        std::fs::rename(tmp, path).unwrap();
    }

    /// The times of the `New schedule.` lines of its log.
    fn new_schedules(&self) -> Vec<SystemTime> {
        let format = time::format_description::well_known::Rfc3339;
        self.daemon
            .logs()
            .lines()
            .filter(|l| l.contains("New schedule."))
            .filter_map(|l| {
                let stamp = l.split_whitespace().next()?;
                time::OffsetDateTime::parse(stamp, &format)
                    .ok()
                    .map(SystemTime::from)
            })
            .collect()
    }

    /// The `n` of `other`'s summary in this DC's schedule.
    fn seen(&self, other: &str) -> Option<u64> {
        self.daemon.json("/v1/schedule")?["data"]["seen"][other].as_u64()
    }

    /// Bytes sent to the other DCs so far.
    fn sent(&self) -> f64 {
        DCS.iter()
            .filter(|dc| **dc != self.name)
            .filter_map(|dc| {
                let series = format!("verwalter_dc_bytes_total{{dc=\"{dc}\",direction=\"sent\"}}");
                metric(self.daemon.port, &series)
            })
            .sum()
    }
}

/// Starts the three DCs under `dir`: the proxies are bound first (each DC names its own as the
/// address to call it at, and the others' as entry points), then aimed at the daemons.
fn start(dir: &Path, one_way: Duration, roles: u64, cap: u64, interval: u64) -> Vec<Dc> {
    std::fs::write(dir.join("cluster.key"), KEY).unwrap();
    let proxies: Vec<DcProxy> = DCS
        .iter()
        .map(|_| DcProxy::bind("127.0.0.1", one_way))
        .collect();
    let addrs: Vec<SocketAddr> = proxies.iter().map(|p| p.addr).collect();
    let mut dcs = Vec::new();
    for (i, (name, proxy)) in DCS.iter().zip(proxies).enumerate() {
        let entries: Vec<String> = (0..3)
            .filter(|j| *j != i)
            .map(|j| format!("{}: [\"{}\"]", DCS[j], addrs[j]))
            .collect();
        let settings = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &settings,
            format!(
                "datacenter: {name}\nelection:\n  key-file: cluster.key\ndatacenters:\n  \
                 entry-points: {{{}}}\n  advertise: \"{}\"\n  traffic-cap-bytes: {cap}\n  \
                 traffic-interval-ms: {interval}\n",
                entries.join(", "),
                addrs[i]
            ),
        )
        .unwrap();
        let config = dir.join(format!("config-{name}"));
        std::fs::create_dir_all(config.join("scheduler/v1")).unwrap();
        std::fs::create_dir_all(config.join("runtime")).unwrap();
        std::fs::write(config.join("scheduler/v1/main.lua"), SCHEDULER).unwrap();
        let storage = dir.join(format!("storage-{name}"));
        let settings = settings.to_str().unwrap().to_string();
        let dc = Dc {
            name,
            config: config.clone(),
            daemon: Daemon::launch(&config, &storage, &["--settings", &settings], &[]),
            proxy,
        };
        dc.set_churn(0, roles);
        dc.proxy
            .forward_to(SocketAddr::from(([127, 0, 0, 1], dc.daemon.port)));
        dcs.push(dc);
    }
    dcs
}

/// The first time in `times` at or after `since`.
fn first_after(times: &[SystemTime], since: SystemTime) -> Option<SystemTime> {
    times.iter().copied().find(|t| *t >= since)
}

/// `TRIALS` summary changes, the DCs taking turns: the time from the changing DC's new schedule
/// to each other DC's schedule naming the change.
fn latency(dcs: &[Dc], trials: u64, roles: u64, next: &mut u64) -> Vec<Duration> {
    let mut samples = Vec::new();
    for trial in 0..trials {
        let from = &dcs[trial as usize % 3];
        *next += 1;
        let n = *next;
        let written = SystemTime::now();
        from.set_churn(n, roles);
        let seen = wait_for(Duration::from_secs(60), || {
            dcs.iter()
                .filter(|dc| dc.name != from.name)
                .all(|dc| dc.seen(from.name) == Some(n))
                .then_some(())
        });
        seen.unwrap_or_else(|| panic!("change {n} of {} not seen in 60 s", from.name));
        let Some(made) = first_after(&from.new_schedules(), written) else {
            panic!("{} logged no new schedule", from.name);
        };
        for dc in dcs.iter().filter(|dc| dc.name != from.name) {
            let at = first_after(&dc.new_schedules(), made).expect("a new schedule");
            samples.push(at.duration_since(made).unwrap_or_default());
        }
    }
    samples
}

/// Bytes each DC sent across DCs over `window`, scaled to an hour; with `churn`, every DC's
/// summary changes that often.
fn bytes_per_hour(
    dcs: &[Dc],
    window: Duration,
    churn: Option<Duration>,
    roles: u64,
    next: &mut u64,
) -> Vec<f64> {
    let before: Vec<f64> = dcs.iter().map(Dc::sent).collect();
    let started = Instant::now();
    while started.elapsed() < window {
        let Some(every) = churn else {
            std::thread::sleep(window);
            break;
        };
        *next += 1;
        for dc in dcs {
            dc.set_churn(*next, roles);
        }
        std::thread::sleep(every.min(window.saturating_sub(started.elapsed())));
    }
    let scale = 3600.0 / started.elapsed().as_secs_f64();
    dcs.iter()
        .zip(before)
        .map(|(dc, before)| (dc.sent() - before) * scale)
        .collect()
}

fn print_bytes(what: &str, per_dc: &[f64], cap_per_hour: f64) {
    let all: f64 = per_dc.iter().sum();
    let each: Vec<String> = DCS
        .iter()
        .zip(per_dc)
        .map(|(dc, b)| format!("{dc} {:.2} MB", b / 1e6))
        .collect();
    println!(
        "  {what:<26} {} (all three {:.2} MB; the cap allows {:.1} MB per leader)",
        each.join(", "),
        all / 1e6,
        cap_per_hour / 1e6
    );
}

fn main() {
    let trials = env_or("TRIALS", 20);
    let one_way = Duration::from_millis(env_or("ONE_WAY_MS", 50));
    let roles = env_or("ROLES", 100);
    let window = Duration::from_secs(env_or("WINDOW_SECS", 60));
    let churn = Duration::from_millis(env_or("CHURN_MS", 10_000));
    let cap = env_or("CAP", 4 << 20);
    let interval = env_or("INTERVAL_MS", 60_000);
    let tmp = tempfile::tempdir().unwrap();
    let dcs = start(tmp.path(), one_way, roles, cap, interval);
    // Every DC sees the others' first summary.
    let ready = wait_for(Duration::from_secs(120), || {
        dcs.iter()
            .all(|dc| {
                DCS.iter()
                    .filter(|o| **o != dc.name)
                    .all(|o| dc.seen(o) == Some(0))
            })
            .then_some(())
    });
    ready.expect("the DCs see each other's summaries within 120 s");
    let summary_bytes = {
        let input = dcs[0].daemon.json("/v1/scheduler_input").unwrap();
        serde_json::to_string(&input["datacenters"]["dcs"]["fra"]["summary"])
            .unwrap()
            .len()
    };
    println!(
        "three one-node DCs, links of {} ms round trip, summaries of {roles} roles ({summary_bytes} bytes of JSON)",
        2 * one_way.as_millis()
    );
    let mut next = 0;
    // One change first, apart: the first exchanges pay for connections.
    let warm = latency(&dcs, 1, roles, &mut next);
    println!(
        "  warm-up change: {:.1} ms",
        ms(*warm.iter().max().unwrap())
    );
    report(
        "summary change -> other DC",
        26,
        "samples",
        latency(&dcs, trials, roles, &mut next),
    );
    let rtts: Vec<String> = dcs
        .iter()
        .filter_map(|dc| {
            let listing = dc.daemon.json("/v1/datacenters")?;
            let rtt = |o: &str| listing["dcs"][o]["rtt_ms"].as_u64();
            let others: Vec<String> = DCS
                .iter()
                .filter(|o| **o != dc.name)
                .map(|o| format!("{o} {:?} ms", rtt(o)))
                .collect();
            Some(format!("{}: {}", dc.name, others.join(", ")))
        })
        .collect();
    println!("  smoothed RTT per link: {}", rtts.join("; "));
    let cap_per_hour = cap as f64 * 3_600_000.0 / interval as f64;
    let idle = bytes_per_hour(&dcs, window, None, roles, &mut next);
    print_bytes("bytes per hour, idle", &idle, cap_per_hour);
    let busy = bytes_per_hour(&dcs, window, Some(churn), roles, &mut next);
    let what = format!("change every {} ms", churn.as_millis());
    print_bytes(&what, &busy, cap_per_hour);
}
