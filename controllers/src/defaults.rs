//! Every built-in default of the daemon's settings, in one table.
//!
//! The settings loader (`src/config/`), the `Default` impls of the typed limits, the `--help`
//! text of `verwalter run` and the tests that check `docs/running.md` all read these constants;
//! a default is changed here and nowhere else. [`shown`] lists them as an operator sees them.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Config root: scheduler, runtime, templates.
pub const CONFIG_DIR: &str = "/etc/verwalter";
/// The daemon's own settings file and secrets (API token, election key) in the packages: beside
/// the config dir, not inside it, which sites deploy by replacing it.
pub const SETTINGS_DIR: &str = "/etc/verwalter.d";
/// The schedule in force, applied hashes, backups.
pub const STORAGE_DIR: &str = "/var/lib/verwalter";
/// The deployment log.
pub const LOG_DIR: &str = "/var/log/verwalter";
/// Address of the HTTP API and the election's UDP socket.
pub const HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// HTTP port, and UDP election port in a cluster; the same on every node (as verwalter 0.13).
pub const PORT: u16 = 8379;
/// Where `--cantal-url` without a value points: cantal's own default address.
pub const CANTAL_URL: &str = "http://127.0.0.1:22682";
/// The frontend built into the binary.
pub const FRONTEND: &str = "common";
/// Where the machine id is read from.
pub const MACHINE_ID_FILE: &str = "/etc/machine-id";

/// verwalter 0.13 reran the scheduler every 5 s plus run time; 10 s is what its README promised
/// and keeps an idle leader quiet. Input changes rerun it at once anyway.
pub const SCHEDULER_PERIOD: Duration = Duration::from_secs(10);
/// A placement over 1,000 nodes takes tens of ms; 2 s is a clear runaway.
pub const SCHEDULER_TIME_LIMIT: Duration = Duration::from_secs(2);
/// Far above what a scheduler for thousands of nodes needs, far below the machine.
pub const SCHEDULER_MEMORY_MIB: u64 = 256;

/// Quiet time after a change before the config dir is re-read.
pub const INPUT_DEBOUNCE: Duration = Duration::from_millis(100);
/// Time limit of one apply command.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(180);
/// Roles of a node rendered and applied at once (the render driver's bound).
pub const RENDER_PARALLEL: usize = 4;

/// A deployment log file continues in a new segment past this size.
pub const LOG_SEGMENT_MIB: u64 = 10;
/// Deployment log files older than this are deleted.
pub const LOG_MAX_AGE_DAYS: u64 = 30;
/// The oldest deployment log files go while all together exceed this.
pub const LOG_MAX_TOTAL_MIB: u64 = 1024;

/// Actions are button clicks, a few hundred bytes each, consumed by the next scheduler run: a
/// thousand pending means the scheduler is failing.
pub(crate) const ACTIONS_MAX_PENDING: u64 = 1000;
/// 4 MiB of actions is a large part of what one Lua run may hold (256 MiB by default, several
/// copies per run).
pub(crate) const ACTIONS_MAX_PENDING_KIB: u64 = 4096;

/// Leader ping period and election round.
pub(crate) const HEARTBEAT: Duration = Duration::from_millis(250);
/// A follower starts an election after hearing nothing from its leader for a random time
/// between these (at least two heartbeats).
pub(crate) const LEADER_TIMEOUT_MIN: Duration = Duration::from_millis(750);
pub(crate) const LEADER_TIMEOUT_MAX: Duration = Duration::from_millis(1250);
/// A starting node waits this (plus the random part) before nominating itself.
pub(crate) const START_TIMEOUT: Duration = Duration::from_millis(1000);
/// A new leader waits at most this for its peers' schedules before scheduling (0.13 waited
/// 15–75 s; the window ends early once every live peer answered).
pub const PREFETCH: Duration = Duration::from_millis(2000);
/// With allow-minority-cluster, peers not heard from directly for this long do not count for
/// the vote (as verwalter 0.13).
pub const MINORITY_WINDOW: Duration = Duration::from_millis(75_000);
/// The fan-out of the relay tree unless set: a leader of 100 followers serves 8 of them, a
/// schedule crosses three hops at most.
pub const RELAY_FANOUT: usize = 8;

/// Open HTTP connections at most (and at most half the descriptor limit).
pub const HTTP_MAX_CONNECTIONS: usize = 512;
/// A connection without a complete request head, or a stalled request body, is closed after
/// this.
pub const HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// `/v1/events` streams at most (and at most a quarter of the connections).
pub const HTTP_MAX_EVENT_STREAMS: usize = 128;
/// A client that takes no event or response data for this long is dropped.
pub const HTTP_STREAM_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// With `http.token-file`, reads of the API stay open unless this is set (only requests that
/// change something need the token).
pub const HTTP_TOKEN_FOR_READS: bool = false;

/// The exchange between data centers (docs/datacenters.md, "Settings"; why these values: the
/// `Default` of `cluster::datacenters::Config`, which takes them from here).
pub const DC_PERIOD: Duration = Duration::from_secs(2);
pub const DC_LINK_TIMEOUT: Duration = Duration::from_secs(10);
pub const DC_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(3);
pub const DC_MAX_BODY_BYTES: usize = 256 << 10;
pub const DC_TRAFFIC_CAP_BYTES: u64 = 4 << 20;
pub const DC_TRAFFIC_INTERVAL: Duration = Duration::from_secs(60);
pub const DC_MAX_LEASE: Duration = Duration::from_secs(3600);

/// One default as the operator sees it: the settings-file key (dotted for nested keys), the
/// flag of `verwalter run` that sets it too, if any, and the value as written in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub key: &'static str,
    pub flag: Option<&'static str>,
    pub value: String,
}

/// Every default that has a literal value, in the order of `docs/running.md`. (The host name,
/// node name and machine id default to what the system says, and have no entry.)
pub fn shown() -> Vec<Shown> {
    fn ms(d: Duration) -> String {
        d.as_millis().to_string()
    }
    let entry = |key, flag, value: String| Shown { key, flag, value };
    vec![
        entry("config-dir", Some("config-dir"), CONFIG_DIR.into()),
        entry("storage-dir", Some("storage-dir"), STORAGE_DIR.into()),
        entry("log-dir", Some("log-dir"), LOG_DIR.into()),
        entry("host", Some("host"), HOST.to_string()),
        entry("port", Some("port"), PORT.to_string()),
        entry("scheduler.period-ms", None, ms(SCHEDULER_PERIOD)),
        entry("scheduler.time-limit-ms", None, ms(SCHEDULER_TIME_LIMIT)),
        entry(
            "scheduler.memory-limit-mib",
            None,
            SCHEDULER_MEMORY_MIB.to_string(),
        ),
        entry("inputs.debounce-ms", None, ms(INPUT_DEBOUNCE)),
        entry(
            "render.command-timeout-secs",
            None,
            COMMAND_TIMEOUT.as_secs().to_string(),
        ),
        entry("render.parallel", None, RENDER_PARALLEL.to_string()),
        entry("render.dependency-failure", None, "block-dependents".into()),
        entry("logs.segment-mib", None, LOG_SEGMENT_MIB.to_string()),
        entry("logs.max-age-days", None, LOG_MAX_AGE_DAYS.to_string()),
        entry("logs.max-total-mib", None, LOG_MAX_TOTAL_MIB.to_string()),
        entry("cantal-url", Some("cantal-url"), CANTAL_URL.into()),
        entry("election.heartbeat-ms", None, ms(HEARTBEAT)),
        entry(
            "election.leader-timeout-min-ms",
            None,
            ms(LEADER_TIMEOUT_MIN),
        ),
        entry(
            "election.leader-timeout-max-ms",
            None,
            ms(LEADER_TIMEOUT_MAX),
        ),
        entry("election.start-timeout-ms", None, ms(START_TIMEOUT)),
        entry("election.prefetch-ms", None, ms(PREFETCH)),
        entry("election.minority-window-ms", None, ms(MINORITY_WINDOW)),
        entry("election.relay-fanout", None, RELAY_FANOUT.to_string()),
        entry(
            "default-frontend",
            Some("default-frontend"),
            FRONTEND.into(),
        ),
        entry("actions.max-pending", None, ACTIONS_MAX_PENDING.to_string()),
        entry(
            "actions.max-pending-kib",
            None,
            ACTIONS_MAX_PENDING_KIB.to_string(),
        ),
        entry(
            "http.max-connections",
            None,
            HTTP_MAX_CONNECTIONS.to_string(),
        ),
        entry("http.idle-timeout-ms", None, ms(HTTP_IDLE_TIMEOUT)),
        entry(
            "http.max-event-streams",
            None,
            HTTP_MAX_EVENT_STREAMS.to_string(),
        ),
        entry(
            "http.stream-stall-timeout-ms",
            None,
            ms(HTTP_STREAM_STALL_TIMEOUT),
        ),
        entry(
            "http.token-for-reads",
            None,
            HTTP_TOKEN_FOR_READS.to_string(),
        ),
        entry("datacenters.period-ms", None, ms(DC_PERIOD)),
        entry("datacenters.link-timeout-ms", None, ms(DC_LINK_TIMEOUT)),
        entry(
            "datacenters.exchange-timeout-ms",
            None,
            ms(DC_EXCHANGE_TIMEOUT),
        ),
        entry(
            "datacenters.max-body-bytes",
            None,
            DC_MAX_BODY_BYTES.to_string(),
        ),
        entry(
            "datacenters.traffic-cap-bytes",
            None,
            DC_TRAFFIC_CAP_BYTES.to_string(),
        ),
        entry(
            "datacenters.traffic-interval-ms",
            None,
            ms(DC_TRAFFIC_INTERVAL),
        ),
        entry("datacenters.max-lease-ms", None, ms(DC_MAX_LEASE)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_follower_timeouts_leave_room_for_two_heartbeats() {
        let all = shown();
        let mut keys: Vec<_> = all.iter().map(|s| s.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), all.len());
        assert!(LEADER_TIMEOUT_MIN >= HEARTBEAT * 2);
        assert!(LEADER_TIMEOUT_MIN <= LEADER_TIMEOUT_MAX);
    }
}
