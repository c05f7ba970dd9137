//! `datacenter:` / `--datacenter`, `datacenters:` and the static peers' `datacenter:` fields,
//! read and checked (docs/datacenters.md, "Settings").

use std::collections::BTreeMap;
use std::time::Duration;

use verwalter_controllers::cluster::datacenters::input::valid_dc_name;
use verwalter_controllers::cluster::datacenters::{Config as Exchange, Dc};
use verwalter_controllers::defaults;

use super::parse::{DatacenterSettings, StaticPeer};

/// This node's DC and what the exchange with the others needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DcSettings {
    /// This node's DC.
    pub(crate) own: Dc,
    /// The other DCs' entry points (`host:port`), by DC.
    pub(crate) entry_points: BTreeMap<Dc, Vec<String>>,
    pub(crate) exchange: Exchange,
    /// The largest exchange body sent or taken.
    pub(crate) max_body: usize,
    /// The DC of each static peer that names one, by machine id (lower case).
    pub(crate) peer_dcs: BTreeMap<String, Dc>,
    /// The `host:port` other DCs reach this node at, when not its listening address.
    pub(crate) advertise: Option<String>,
}

/// What a DC name must look like, for the problems.
const NAME_RULE: &str = "1-64 characters of a-z, 0-9, '-', '_', '.'";

/// Reads the DC settings. `own` is the flag's or the file's `datacenter`; without it the node is
/// in no DC and the rest is ignored (with a warning when given). Every problem goes to
/// `problems`, named by its key.
pub(crate) fn resolve(
    own: Option<&str>,
    has_key: bool,
    file: &DatacenterSettings,
    peers: &[StaticPeer],
    problems: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Option<DcSettings> {
    let mut peer_dcs = BTreeMap::new();
    for (i, peer) in peers.iter().enumerate() {
        let Some(dc) = &peer.datacenter else { continue };
        if valid_dc_name(dc) {
            peer_dcs.insert(peer.id.to_ascii_lowercase(), dc.clone());
        } else {
            problems.push(format!(
                "peers[{i}].datacenter: {dc:?} is not a data center name ({NAME_RULE})"
            ));
        }
    }
    let Some(own) = own else {
        if !file.entry_points.is_empty() || !peer_dcs.is_empty() {
            warnings.push(
                "datacenters and the peers' datacenter fields are ignored: this node has no \
                 datacenter (set `datacenter:` or --datacenter)"
                    .into(),
            );
        }
        return None;
    };
    if !valid_dc_name(own) {
        problems.push(format!(
            "datacenter: {own:?} is not a data center name ({NAME_RULE})"
        ));
    }
    if !has_key {
        warnings.push(format!(
            "datacenter {own}: no election.key-file, so no exchange with other data centers \
             (the election and schedule distribution still stay inside {own})"
        ));
    }
    let entry_points = entry_points(own, file, problems);
    let ms = |value: Option<u64>, default: Duration| value.map_or(default, Duration::from_millis);
    let exchange = Exchange {
        period: ms(file.period_ms, defaults::DC_PERIOD),
        link_timeout: ms(file.link_timeout_ms, defaults::DC_LINK_TIMEOUT),
        exchange_timeout: ms(file.exchange_timeout_ms, defaults::DC_EXCHANGE_TIMEOUT),
        traffic_cap: file
            .traffic_cap_bytes
            .unwrap_or(defaults::DC_TRAFFIC_CAP_BYTES),
        traffic_interval: ms(file.traffic_interval_ms, defaults::DC_TRAFFIC_INTERVAL),
        max_lease: ms(file.max_lease_ms, defaults::DC_MAX_LEASE),
    };
    let mut others: Vec<&Dc> = entry_points.keys().collect();
    others.extend(peer_dcs.values().filter(|dc| *dc != own));
    others.sort();
    others.dedup();
    problems.extend(exchange.check(others.len()).iter().map(ToString::to_string));
    let max_body = match file.max_body_bytes {
        None => defaults::DC_MAX_BODY_BYTES,
        Some(0) => {
            problems.push("datacenters.max-body-bytes: must be above 0".into());
            0
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    if let Some(addr) = &file.advertise
        && !is_host_port(addr)
    {
        problems.push(format!("datacenters.advertise: {addr:?} is not host:port"));
    }
    Some(DcSettings {
        own: own.to_string(),
        entry_points,
        exchange,
        max_body,
        peer_dcs,
        advertise: file.advertise.clone(),
    })
}

/// `datacenters.entry-points`: valid DC names other than this node's, each a list of
/// `host:port`.
fn entry_points(
    own: &str,
    file: &DatacenterSettings,
    problems: &mut Vec<String>,
) -> BTreeMap<Dc, Vec<String>> {
    let mut out = BTreeMap::new();
    for (dc, addrs) in &file.entry_points {
        let key = format!("datacenters.entry-points.{dc}");
        if !valid_dc_name(dc) {
            problems.push(format!(
                "{key}: {dc:?} is not a data center name ({NAME_RULE})"
            ));
            continue;
        }
        if dc == own {
            problems.push(format!("{key}: this node's own data center"));
            continue;
        }
        for (i, addr) in addrs.iter().enumerate() {
            if !is_host_port(addr) {
                problems.push(format!("{key}[{i}]: {addr:?} is not host:port"));
            }
        }
        out.insert(dc.clone(), addrs.clone());
    }
    out
}

/// `host:port` with a host and a port above 0.
fn is_host_port(addr: &str) -> bool {
    let port = addr
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    matches!(port, Some((host, Ok(p))) if !host.is_empty() && p != 0)
}

#[cfg(test)]
mod tests {
    use super::super::tests::settings_args;
    use super::super::{Config, ConfigError};

    fn load(text: &str) -> Result<Config, ConfigError> {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("settings.yaml");
        std::fs::write(&file, text).unwrap();
        Config::load(&settings_args(&file))
    }

    #[test]
    fn a_node_without_a_datacenter_is_in_none_and_the_peers_dcs_only_warn() {
        let config = load(
            "peers:\n- {id: 77985419c732412ea38b94db00000002, addr: \"127.0.0.2:8379\", \
             hostname: b, datacenter: fra}\n",
        )
        .unwrap();
        assert_eq!(config.datacenter, None);
        assert!(
            config.warnings.iter().any(|w| w.contains("ignored")),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn the_datacenter_the_peers_and_the_settings_are_read() {
        let config = load(
            "datacenter: ams\n\
             peers:\n- {id: 77985419C732412EA38B94DB00000002, addr: \"127.0.0.2:8379\", \
             hostname: b, datacenter: fra}\n\
             - {id: 77985419c732412ea38b94db00000003, addr: \"127.0.0.3:8379\", hostname: c}\n\
             datacenters:\n  entry-points: {lon: [\"lon1.example.com:8379\"]}\n  period-ms: 500\n  \
             link-timeout-ms: 1000\n  max-body-bytes: 1000\n",
        )
        .unwrap();
        let dc = config.datacenter.unwrap();
        assert_eq!(dc.own, "ams");
        assert_eq!(dc.exchange.period.as_millis(), 500);
        assert_eq!(dc.exchange.link_timeout.as_millis(), 1000);
        assert_eq!(dc.max_body, 1000);
        assert_eq!(dc.entry_points["lon"], ["lon1.example.com:8379"]);
        assert!(
            config
                .warnings
                .iter()
                .any(|w| w.contains("datacenter ams: no election.key-file")),
            "{:?}",
            config.warnings
        );
        assert_eq!(
            dc.peer_dcs.into_iter().collect::<Vec<_>>(),
            [("77985419c732412ea38b94db00000002".into(), "fra".into())]
        );
    }

    #[test]
    fn every_bad_value_is_named_by_its_key() {
        let err = load(
            "datacenter: AMS\n\
             peers:\n- {id: 77985419c732412ea38b94db00000002, addr: \"127.0.0.2:8379\", \
             hostname: b, datacenter: \"fr a\"}\n\
             datacenters:\n  entry-points: {\"Lon\": [], ams: [], fra: [\"nowhere\"]}\n  \
             exchange-timeout-ms: 0\n  max-body-bytes: 0\n  traffic-cap-bytes: 10\n  advertise: nowhere\n",
        )
        .unwrap_err()
        .to_string();
        for part in [
            "peers[0].datacenter: \"fr a\" is not a data center name",
            "datacenter: \"AMS\" is not a data center name",
            "datacenters.entry-points.Lon: \"Lon\" is not a data center name",
            "datacenters.entry-points.fra[0]: \"nowhere\" is not host:port",
            "datacenters.exchange-timeout-ms: must be above 0",
            "datacenters.max-body-bytes: must be above 0",
            "datacenters.advertise: \"nowhere\" is not host:port",
            "datacenters.traffic-cap-bytes: 10 is under twice",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
        // `ams` is this node's DC only after the name check; with a good name it is refused.
        let err = load("datacenter: ams\ndatacenters:\n  entry-points: {ams: []}\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("datacenters.entry-points.ams: this node's own data center"),
            "{err}"
        );
    }
}
