//! wca's `loggers:` (Python logger name → level) mapped onto verwalter's log targets, as
//! `tracing_subscriber::EnvFilter` directives (`target=level`). wca's loggers form a tree by
//! their dotted names, and so do the targets: `wca.scheduler: DEBUG` covers the server, the
//! algorithms and the data providers, as in Python. A name verwalter has no counterpart for is
//! refused with a line saying what to use instead.

use std::collections::BTreeMap;

/// The target the extender logs each decision under (with its reasons, at debug).
pub const DECISIONS_TARGET: &str = "verwalter::placement::decisions";

/// wca's logger names and the targets each one stands for.
pub(crate) const LOGGERS: [(&str, &[&str]); 7] = [
    ("wca", &["verwalter"]),
    (
        "wca.scheduler",
        &["verwalter::placement", "verwalter_placement"],
    ),
    (
        "wca.scheduler.server",
        &["verwalter::placement::extender", "verwalter::http"],
    ),
    (
        "wca.scheduler.algorithms",
        &[DECISIONS_TARGET, "verwalter_placement"],
    ),
    (
        "wca.scheduler.data_providers",
        &[
            "verwalter::placement::start",
            "verwalter::placement::refresh",
            "verwalter::placement::kube",
            "verwalter::placement::prometheus",
            "verwalter::placement::client",
            "verwalter::placement::snapshot_file",
        ],
    ),
    ("wca.scheduler.kubeapi", &["verwalter::placement::kube"]),
    ("wca.prometheus", &["verwalter::placement::prometheus"]),
];

/// What to do with a config's `loggers`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogPlan {
    /// `target=level` directives, parents before children (a child's own level wins, as in
    /// Python, since the more specific directive is the one that applies).
    pub directives: Vec<String>,
    /// One line per logger that is not applied, saying what to use.
    pub refused: Vec<String>,
}

/// A Python level name (any case) as a tracing level; `CRITICAL` is `error`.
pub(crate) fn level(python: &str) -> Option<&'static str> {
    Some(match python.to_ascii_uppercase().as_str() {
        "TRACE" => "trace",
        "DEBUG" => "debug",
        "INFO" => "info",
        "WARN" | "WARNING" => "warn",
        "ERROR" | "CRITICAL" => "error",
        _ => return None,
    })
}

/// The directives for `loggers` (as the config loader keeps them), and the refused ones.
pub fn plan(loggers: &BTreeMap<String, String>) -> LogPlan {
    let mut out = LogPlan::default();
    let known = || {
        LOGGERS
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    // BTreeMap order puts a parent before its children (`wca` < `wca.scheduler`).
    for (name, given) in loggers {
        let Some(level) = level(given) else {
            out.refused.push(format!(
                "loggers: {name}: level {given:?} is not one of TRACE, DEBUG, INFO, WARNING, \
                 ERROR, CRITICAL; not applied"
            ));
            continue;
        };
        match LOGGERS.iter().find(|(n, _)| n == name) {
            Some((_, targets)) => out
                .directives
                .extend(targets.iter().map(|t| format!("{t}={level}"))),
            None => out.refused.push(format!(
                "loggers: {name} is not a wca logger verwalter has a counterpart for (it maps {}); \
                 not applied. Use RUST_LOG with verwalter's targets instead, e.g. \
                 RUST_LOG=info,{DECISIONS_TARGET}=debug",
                known()
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loggers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(n, l)| (n.to_string(), l.to_string()))
            .collect()
    }

    #[test]
    fn wcas_example_loggers_map_onto_targets_parent_first() {
        // wca's newest example config.
        let p = plan(&loggers(&[
            ("wca", "DEBUG"),
            ("wca.scheduler.server", "INFO"),
            ("wca.scheduler.algorithms", "TRACE"),
            ("wca.scheduler.data_providers", "DEBUG"),
        ]));
        assert!(p.refused.is_empty(), "{:?}", p.refused);
        assert_eq!(p.directives[0], "verwalter=debug");
        for d in [
            "verwalter::placement::decisions=trace",
            "verwalter_placement=trace",
            "verwalter::placement::refresh=debug",
            "verwalter::placement::extender=info",
        ] {
            assert!(
                p.directives.iter().any(|x| x == d),
                "{d}: {:?}",
                p.directives
            );
        }
    }

    #[test]
    fn levels_in_any_case_and_critical_is_error() {
        let p = plan(&loggers(&[("wca.scheduler", "critical")]));
        assert_eq!(
            p.directives,
            ["verwalter::placement=error", "verwalter_placement=error"]
        );
        assert_eq!(level("Warning"), Some("warn"));
        assert_eq!(level("verbose"), None);
    }

    #[test]
    fn an_unknown_logger_is_refused_saying_what_to_use() {
        let p = plan(&loggers(&[
            ("urllib3", "DEBUG"),
            ("wca.scheduler", "DEBUG"),
        ]));
        assert_eq!(p.directives.len(), 2);
        assert_eq!(p.refused.len(), 1);
        assert!(p.refused[0].starts_with("loggers: urllib3 is not a wca logger"));
        assert!(p.refused[0].contains("RUST_LOG=info,verwalter::placement::decisions=debug"));
    }
}
