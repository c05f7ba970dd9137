//! Score's reschedule hook: which running app instances should move to another node type, and
//! why. Pure: it reads a snapshot and says; deleting the pods (so that kube-scheduler places them
//! again) is someone else's job.
//!
//! An instance is misplaced when Score's own node-type rule (pass 2, as in strict mode) would not
//! put it where it runs: an app that goes to DRAM nodes on a PMEM node, or one that goes to PMEM
//! on a DRAM node (every node not known as PMEM counts as DRAM, as in the filter).
//!
//! Like wca: nothing moves unless some instance on a DRAM node goes to PMEM. Then every instance
//! misplaced on a PMEM node moves off it ([`Reason::OffPmem`], freeing room), and the instances
//! that go to PMEM move in the order of their app's profile (the app that goes to PMEM most
//! first, i.e. the lowest profile), newest task name first, each to the first PMEM node (by name)
//! where Score's pass 1 (Fit with `cpu_scale_factor`, the DRAM hit ratio) accepts it once the
//! moves before it are counted ([`Reason::ToPmem`]); an instance no PMEM node takes stays.
//! Unlike wca, an instance that fits on several PMEM nodes is moved once (wca lists it once per
//! node), and instances of an app without a spec (its size unknown) stay.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::algorithms::{Algorithm, Kind};
use crate::snapshot::{Assigned, Snapshot};

/// One instance that should move.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Move {
    pub(crate) app: String,
    /// Where it runs now.
    pub(crate) node: String,
    /// Its task (pod) name, when the snapshot lists names rather than a count.
    pub task: Option<String>,
    pub(crate) reason: Reason,
}

/// Why an instance should move.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reason {
    /// The app goes to DRAM nodes but runs on a PMEM node, whose room an app that goes to PMEM
    /// wants.
    OffPmem,
    /// The app goes to PMEM nodes but runs on a DRAM node; PMEM node `to` has room for it.
    ToPmem { to: String },
}

/// The instances Score's reschedule would move on `snap`, in the order it decides them (those
/// leaving PMEM first). Empty for every algorithm but Score.
pub fn reschedule(algorithm: &Algorithm, snap: &Snapshot) -> Vec<Move> {
    let Kind::Score {
        cpu_scale_factor,
        threshold,
        score_target,
        ..
    } = algorithm.kind
    else {
        return Vec::new();
    };
    // Score as in strict mode: pass 2 then rejects a node of the wrong type even when it is the
    // only one, which is the question asked of each instance here.
    let strict = Algorithm {
        kind: Kind::Score {
            cpu_scale_factor,
            threshold,
            score_target,
            strict_mode_placement: true,
        },
        ..algorithm.clone()
    };
    let misplaced = |node: &String, app: &str| {
        !strict
            .app_fit_nodes(snap, std::slice::from_ref(node), app)
            .is_empty()
    };
    let mut off_pmem = Vec::new();
    let mut to_pmem = Vec::new();
    for (node, apps) in &snap.assigned_apps {
        for (app, assigned) in apps {
            if assigned.count() == 0 || !misplaced(node, app) {
                continue;
            }
            let instances = instances(app, node, assigned);
            if snap.is_pmem(node) {
                off_pmem.extend(instances);
            } else if snap.apps_spec.contains_key(app) {
                to_pmem.extend(instances);
            }
        }
    }
    if to_pmem.is_empty() {
        return Vec::new();
    }

    let mut working = snap.clone();
    let mut moves = Vec::new();
    for (app, node, task) in off_pmem {
        remove_instance(&mut working, &node, &app, task.as_deref());
        moves.push(Move {
            app,
            node,
            task,
            reason: Reason::OffPmem,
        });
    }
    let profile = |app: &str| snap.app_profiles.get(app).copied().unwrap_or(f64::INFINITY);
    to_pmem.sort_by(|(a, _, ta), (b, _, tb)| {
        profile(a)
            .total_cmp(&profile(b))
            .then_with(|| a.cmp(b))
            .then_with(|| tb.cmp(ta))
    });
    let pmem_nodes: Vec<&String> = snap
        .node_capacities
        .keys()
        .filter(|n| snap.is_pmem(n))
        .collect();
    for (app, node, task) in to_pmem {
        let target = pmem_nodes
            .iter()
            .find(|to| strict.app_fit_node(&working, to, &app).is_ok());
        let Some(&to) = target else {
            continue;
        };
        remove_instance(&mut working, &node, &app, task.as_deref());
        add_instance(&mut working, to, &app, task.as_deref());
        moves.push(Move {
            app,
            node,
            task,
            reason: Reason::ToPmem { to: to.clone() },
        });
    }
    moves
}

/// `(app, node, task)` for each instance of `app` on `node`.
fn instances(app: &str, node: &str, assigned: &Assigned) -> Vec<(String, String, Option<String>)> {
    match assigned {
        Assigned::Count(n) => (0..*n).map(|_| (app.into(), node.into(), None)).collect(),
        Assigned::Tasks(tasks) => tasks
            .iter()
            .map(|t| (app.into(), node.into(), Some(t.clone())))
            .collect(),
    }
}

fn remove_instance(snap: &mut Snapshot, node: &str, app: &str, task: Option<&str>) {
    let Some(apps) = snap.assigned_apps.get_mut(node) else {
        return;
    };
    match (apps.get_mut(app), task) {
        (Some(Assigned::Tasks(tasks)), Some(task)) => tasks.retain(|t| t != task),
        (Some(Assigned::Count(n)), _) => *n = n.saturating_sub(1),
        _ => {}
    }
}

fn add_instance(snap: &mut Snapshot, node: &str, app: &str, task: Option<&str>) {
    let apps: &mut BTreeMap<String, Assigned> = snap.assigned_apps.entry(node.into()).or_default();
    let assigned = apps
        .entry(app.into())
        .or_insert_with(|| Assigned::Tasks(Vec::new()));
    match (assigned, task) {
        (Assigned::Tasks(tasks), Some(task)) => tasks.push(task.into()),
        (assigned, _) => *assigned = Assigned::Count(assigned.count() + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Dim, NodeFacts, NodeType};

    fn score(score_target: Option<f64>) -> Algorithm {
        Algorithm::new(Kind::Score {
            cpu_scale_factor: 1.0,
            threshold: 0.97,
            score_target,
            strict_mode_placement: false,
        })
    }

    fn tasks(names: &[&str]) -> Assigned {
        Assigned::Tasks(names.iter().map(|n| n.to_string()).collect())
    }

    /// p1: PMEM (cpu 10, mem 100, hit ratio 0.99); d1, d2: DRAM of the same size. Profiles
    /// a = 1, b = 5, c = 9: without `score_target` only `a` (the lowest) goes to PMEM.
    /// Running: b-1, b-2 on p1; a-1, a-2, a-3 and one c on d1. Requests: a cpu 4, b cpu 3, c cpu 1
    /// (mem 10 each).
    fn cluster() -> Snapshot {
        let mut s = Snapshot::default();
        for (node, kind) in [
            ("p1", NodeType::Pmem),
            ("d1", NodeType::Dram),
            ("d2", NodeType::Dram),
        ] {
            s.node_capacities.insert(
                node.into(),
                BTreeMap::from([(Dim::Cpu, 10.0), (Dim::Mem, 100.0)]),
            );
            s.nodes.insert(
                node.into(),
                NodeFacts {
                    platform_dram_hit_ratio: Some(0.99),
                    node_type: Some(kind),
                },
            );
        }
        for (app, cpu) in [("a", 4.0), ("b", 3.0), ("c", 1.0)] {
            s.apps_spec.insert(
                app.into(),
                BTreeMap::from([(Dim::Cpu, cpu), (Dim::Mem, 10.0)]),
            );
        }
        s.app_profiles = BTreeMap::from([("a".into(), 1.0), ("b".into(), 5.0), ("c".into(), 9.0)]);
        s.assigned_apps.insert(
            "p1".into(),
            BTreeMap::from([("b".into(), tasks(&["b-1", "b-2"]))]),
        );
        s.assigned_apps.insert(
            "d1".into(),
            BTreeMap::from([
                ("a".into(), tasks(&["a-1", "a-2", "a-3"])),
                ("c".into(), Assigned::Count(1)),
            ]),
        );
        s
    }

    fn summary(moves: &[Move]) -> Vec<String> {
        moves
            .iter()
            .map(|m| {
                let what = m.task.clone().unwrap_or_else(|| m.app.clone());
                match &m.reason {
                    Reason::OffPmem => format!("{what} off {}", m.node),
                    Reason::ToPmem { to } => format!("{what} {} -> {to}", m.node),
                }
            })
            .collect()
    }

    #[test]
    fn misplaced_instances_leave_pmem_and_the_pmem_app_moves_in_while_it_fits() {
        // b leaves p1 (cpu 0 of 10 used then). a, newest first: a-3 (4), a-2 (8) fit; a-1 would
        // need 12 > 10 and stays on d1. c goes to DRAM and runs on DRAM: stays.
        let moves = reschedule(&score(None), &cluster());
        assert_eq!(
            summary(&moves),
            vec!["b-1 off p1", "b-2 off p1", "a-3 d1 -> p1", "a-2 d1 -> p1"]
        );
        assert_eq!(
            serde_json::to_value(&moves[2]).unwrap(),
            serde_json::json!({"app": "a", "node": "d1", "task": "a-3", "reason": {"to_pmem": {"to": "p1"}}})
        );
    }

    #[test]
    fn nothing_moves_unless_an_instance_goes_to_pmem() {
        // Two profiles are too few for Score to send anything to PMEM: b on p1 is misplaced, but
        // no app wants its room.
        let mut s = cluster();
        s.app_profiles.remove("c");
        assert_eq!(reschedule(&score(None), &s), vec![]);
        // Nor for another algorithm.
        let fit = Algorithm::new(Kind::Fit {
            cpu_scale_factor: 1.0,
        });
        assert_eq!(reschedule(&fit, &cluster()), vec![]);
    }

    #[test]
    fn score_target_decides_who_goes_to_pmem() {
        // Profiles ≤ 5 go to PMEM: a and b. b is where it belongs; a moves in while it fits:
        // p1 holds b (6 of 10 cpu), so only a-3 (6 + 4 = 10) does.
        let moves = reschedule(&score(Some(5.0)), &cluster());
        assert_eq!(summary(&moves), vec!["a-3 d1 -> p1"]);
    }

    #[test]
    fn a_pmem_node_below_the_hit_ratio_takes_nothing() {
        // Score's pass 1 refuses p1 (0.9 < 0.97), so a stays; b still leaves, as in wca.
        let mut s = cluster();
        s.nodes.get_mut("p1").unwrap().platform_dram_hit_ratio = Some(0.9);
        assert_eq!(
            summary(&reschedule(&score(None), &s)),
            vec!["b-1 off p1", "b-2 off p1"]
        );
    }

    #[test]
    fn counted_instances_move_without_names_and_cpu_scale_factor_counts() {
        // a as a count of 3; cpu_scale_factor 0.5 halves p1's cpu to 5 after b leaves: one a.
        let mut s = cluster();
        s.assigned_apps
            .get_mut("d1")
            .unwrap()
            .insert("a".into(), Assigned::Count(3));
        let mut algorithm = score(None);
        if let Kind::Score {
            cpu_scale_factor, ..
        } = &mut algorithm.kind
        {
            *cpu_scale_factor = 0.5;
        }
        let moves = reschedule(&algorithm, &s);
        assert_eq!(
            summary(&moves),
            vec!["b-1 off p1", "b-2 off p1", "a d1 -> p1"]
        );
        assert_eq!(moves[2].task, None);
    }
}
