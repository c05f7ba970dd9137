//! A cluster moving between the built-in election and etcd by a rolling restart (docs/etcd.md,
//! "Moving between backends", issue 36): five nodes on 127.0.0.1–5 with the cantal test double
//! and a shared election key, a real 3-member etcd on 127.0.0.141–143. Each node is restarted
//! (SIGTERM, then started again on the same config dir, storage dir and port) with the other
//! backend, one at a time. At every look, at most one node says it leads and every node that
//! answers holds a schedule.
//!
//! Skipped with a message when `etcd` or `etcdctl` is missing, failing instead under `CI`.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::Value;

use crate::cluster::{MORE_NAMES, start_cantal};
use crate::etcd::{Etcd, etcd_tmp, id, tools};
use crate::util::*;

/// Generous bound for elections and fetches on a loaded CI machine.
const SOON: Duration = Duration::from_secs(30);
const PREFIX: &str = "/verwalter/move";
const N: usize = 5;
/// Votes a built-in leader needs (and keeps needing) among the `N` nodes.
const MAJORITY: usize = N / 2 + 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Builtin,
    Etcd,
}

struct Node {
    host: String,
    child: Option<Child>,
    log: PathBuf,
    /// Starts so far (each writes its own log).
    runs: usize,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Site {
    tmp: tempfile::TempDir,
    cantal: Child,
    url: String,
    etcd: Etcd,
    nodes: Vec<Node>,
    port: u16,
    /// Set once every node held a schedule: from then on, every node that answers must.
    scheduled: bool,
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = self.cantal.kill();
        let _ = self.cantal.wait();
    }
}

impl Site {
    /// etcd, the cantal double and the nodes on the built-in election.
    fn start(test: &str, etcd_base: u8) -> Option<Site> {
        let (etcd_bin, etcdctl) = tools(test)?;
        let tmp = etcd_tmp();
        let etcd = Etcd::start(&etcd_bin, etcdctl, tmp.path(), etcd_base);
        let (cantal, url) = start_cantal(tmp.path(), &MORE_NAMES[..N]);
        std::fs::write(
            tmp.path().join("cluster.key"),
            "a shared election key of this test cluster\n",
        )
        .unwrap();
        let endpoints: Vec<String> = etcd.ips.iter().map(|ip| format!("{ip}:2379")).collect();
        std::fs::write(
            tmp.path().join("builtin.yaml"),
            "election:\n  key-file: cluster.key\n",
        )
        .unwrap();
        std::fs::write(
            tmp.path().join("etcd.yaml"),
            format!(
                "election:\n  key-file: cluster.key\n  backend: etcd\n  etcd:\n    endpoints: [{}]\n    prefix: {PREFIX}\n    lease-ttl: 2s\n",
                endpoints.join(", ")
            ),
        )
        .unwrap();
        let mut site = Site {
            tmp,
            cantal,
            url,
            etcd,
            nodes: Vec::new(),
            port: 0,
            scheduled: false,
        };
        for i in 0..N {
            let n = i + 1;
            copy_tree(
                &example("minimal"),
                &site.tmp.path().join(format!("config{n}")),
            );
            site.nodes.push(Node {
                host: format!("127.0.0.{n}"),
                child: None,
                log: PathBuf::new(),
                runs: 0,
            });
            site.launch(i, Backend::Builtin);
            if i == 0 {
                let log = &site.nodes[0].log;
                site.port = wait_for(SOON, || listening_port(&std::fs::read_to_string(log).ok()?))
                    .unwrap_or_else(|| panic!("node 1 does not listen:\n{}", site.logs()));
            }
        }
        Some(site)
    }

    /// Starts node `i` on `backend`, on its config and storage dirs and the site's port.
    fn launch(&mut self, i: usize, backend: Backend) {
        let n = i + 1;
        let dir = self.tmp.path();
        let node = &mut self.nodes[i];
        node.runs += 1;
        node.log = dir.join(format!("node{n}-{}.log", node.runs));
        let settings = match backend {
            Backend::Builtin => dir.join("builtin.yaml"),
            Backend::Etcd => dir.join("etcd.yaml"),
        };
        let mut command = Command::new(BIN);
        command.arg("run");
        with_dirs(
            &mut command,
            &dir.join(format!("config{n}")),
            &dir.join(format!("storage{n}")),
            &node.log,
        );
        let child = command
            .arg("--settings")
            .arg(settings)
            .args(["--hostname", MORE_NAMES[i], "--name"])
            .arg(format!("{}.test", MORE_NAMES[i]))
            .args(["--host", &node.host, "--port", &self.port.to_string()])
            .arg("--override-machine-id")
            .arg(id(i))
            .arg("--cantal-url")
            .arg(&self.url)
            .spawn()
            .unwrap();
        node.child = Some(child);
    }

    /// Stops node `i` as an operator does (SIGTERM) and starts it on `backend`; returns once it
    /// answers.
    fn restart(&mut self, i: usize, backend: Backend) {
        let mut child = self.nodes[i].child.take().unwrap();
        crate::util::terminate_child(&mut child);
        self.launch(i, backend);
        self.wait(&format!("node {} answers", i + 1), |s| {
            s.json(i, "/v1/status").map(drop)
        });
    }

    fn json(&self, i: usize, path: &str) -> Option<Value> {
        let (code, body) = http_get_at(&self.nodes[i].host, self.port, path)?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    /// The sum of the series of `name` whose labels start with `labels` (`""`: all of them).
    fn metric(&self, i: usize, name: &str, labels: &str) -> f64 {
        let (_, body) = http_get_at(&self.nodes[i].host, self.port, "/metrics").unwrap_or_default();
        body.lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter(|rest| rest.starts_with(' ') || rest.starts_with(&format!("{{{labels}")))
            .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn is_leader(&self, i: usize) -> bool {
        self.json(i, "/v1/status")
            .is_some_and(|s| s["election_state"]["is_leader"] == true)
    }

    /// The (hash, origin) of the schedule node `i` holds.
    fn schedule(&self, i: usize) -> Option<(String, String)> {
        let s = self.json(i, "/v1/schedule")?;
        Some((s["hash"].as_str()?.into(), s["origin"].as_str()?.into()))
    }

    /// The etcd view's built-in leader node `i` defers to.
    fn defers_to(&self, i: usize) -> Option<String> {
        let election = self.json(i, "/v1/election")?;
        Some(election["etcd"]["deferring"]["node"].as_str()?.to_string())
    }

    fn logs(&self) -> String {
        let nodes: String = (0..N)
            .map(|i| {
                let log = std::fs::read_to_string(&self.nodes[i].log).unwrap_or_default();
                format!("=== node {} ===\n{log}", i + 1)
            })
            .collect();
        format!("{nodes}{}", self.etcd.logs())
    }

    /// The rule of every look: every node that answers holds a schedule (once they all held
    /// one), and at most one says it leads. Two seen in one look are looked at again: a handover in flight (the new
    /// built-in leader's first ping on its way to the etcd leader) is over by then, two leaders
    /// that last are not.
    fn check(&self) {
        let mut leaders = Vec::new();
        for i in 0..N {
            let Some(status) = self.json(i, "/v1/status") else {
                continue;
            };
            if status["election_state"]["is_leader"] == true {
                leaders.push(i);
            }
            assert!(
                !self.scheduled || self.schedule(i).is_some(),
                "node {} answers without a schedule:\n{}",
                i + 1,
                self.logs()
            );
        }
        if leaders.len() > 1 {
            let still: Vec<usize> = leaders.into_iter().filter(|i| self.is_leader(*i)).collect();
            assert!(
                still.len() <= 1,
                "nodes {still:?} lead at once:\n{}",
                self.logs()
            );
        }
    }

    /// Waits for `probe`, checking the rule at every look.
    fn wait<T>(&self, what: &str, mut probe: impl FnMut(&Site) -> Option<T>) -> T {
        wait_for(SOON, || {
            self.check();
            probe(self)
        })
        .unwrap_or_else(|| panic!("{what}: not seen:\n{}", self.logs()))
    }

    /// One node leads, every node holds its schedule: the leader and the hash.
    fn converged_now(&self) -> Option<(usize, String)> {
        let leaders: Vec<usize> = (0..N).filter(|i| self.is_leader(*i)).collect();
        let [leader] = leaders[..] else { return None };
        let (hash, origin) = self.schedule(leader)?;
        let everywhere = (0..N).all(|i| self.schedule(i).is_some_and(|s| s.0 == hash));
        (origin == id(leader) && everywhere).then_some((leader, hash))
    }

    /// A new version of `web` in every config dir (as a deploy tool uploads it): the leader's
    /// scheduler makes a new schedule.
    fn new_version(&self, version: &str) {
        for n in 1..=N {
            let dir = self.tmp.path().join(format!("config{n}/runtime/web"));
            replace_file(
                &dir.join(format!("{version}.yaml")),
                &format!("image: web.{version}\ninstances: 1\n"),
            );
        }
    }

    fn etcd_leader_key(&self) -> Option<Value> {
        self.etcd
            .get(&format!("{PREFIX}/leader"), None)
            .map(|(_, value)| value)
    }
}

/// The built-in election to etcd, the built-in leader's followers first: while the built-in
/// side keeps its majority, its leader leads the moved nodes too (they defer to it, campaign
/// nowhere, send nothing and take its new schedule); once the majority has moved, its leader
/// steps down and etcd elects one of the moved nodes, whose schedule they all hold, while the
/// built-in nodes left keep theirs; the built-in leader, moved last, follows the etcd leader.
/// Returns the etcd leader.
fn builtin_to_etcd(site: &mut Site) -> usize {
    let (l, _) = site.wait("a built-in leader with its schedule everywhere", |s| {
        s.converged_now()
    });
    site.scheduled = true;
    let mut moved: Vec<usize> = Vec::new();
    for f in (0..N).filter(|i| *i != l) {
        site.restart(f, Backend::Etcd);
        moved.push(f);
        if N - moved.len() >= MAJORITY {
            site.wait("the moved nodes defer to the built-in leader", |s| {
                let theirs = s.schedule(l)?;
                let follow = moved.iter().all(|m| {
                    s.defers_to(*m).as_ref() == Some(&id(l))
                        && s.schedule(*m).as_ref() == Some(&theirs)
                });
                (follow && s.is_leader(l)).then_some(())
            });
            if moved.len() == 1 {
                site.new_version("v3");
                let new = site.wait(
                    "the built-in leader's new schedule on the moved node",
                    |s| {
                        let theirs = s.schedule(l)?;
                        let web = s.json(l, "/v1/schedule")?["data"]["roles"]["web"].to_string();
                        (web.contains("v3") && s.schedule(f)? == theirs).then_some(theirs)
                    },
                );
                assert_eq!(new.1, id(l));
            }
            assert!(site.metric(f, "verwalter_etcd_deferrals_total", "") >= 1.0);
            assert_eq!(site.etcd_leader_key(), None, "nobody leads on etcd");
            assert!(moved.iter().all(|m| !site.is_leader(*m)));
            // Listen-only: the etcd node heard the pings and sent nothing.
            assert!(
                site.metric(
                    f,
                    "verwalter_election_messages_received_total",
                    "type=\"ping\""
                ) >= 1.0
            );
            assert_eq!(
                site.metric(f, "verwalter_election_messages_sent_total", ""),
                0.0
            );
        } else {
            let e = site.wait(
                "an etcd leader among the moved nodes, followed by them",
                |s| {
                    let [e] = moved
                        .iter()
                        .copied()
                        .filter(|m| s.is_leader(*m))
                        .collect::<Vec<_>>()[..]
                    else {
                        return None;
                    };
                    let (hash, origin) = s.schedule(e)?;
                    let all = moved
                        .iter()
                        .all(|m| s.schedule(*m).is_some_and(|h| h.0 == hash));
                    (origin == id(e) && all && !s.is_leader(l)).then_some(e)
                },
            );
            assert_eq!(site.etcd_leader_key().unwrap()["node"], id(e).as_str());
        }
    }
    site.restart(l, Backend::Etcd);
    let (leader, _) = site.wait("one etcd leader, its schedule everywhere", |s| {
        s.converged_now()
    });
    assert_eq!(site.etcd_leader_key().unwrap()["node"], id(leader).as_str());
    leader
}

/// A ping that is not tagged with the cluster's key, from a listed peer's address, changes
/// nothing on the etcd leader: dropped and counted, the leader leads on.
fn an_untagged_ping_is_dropped(site: &Site, e: usize) {
    use verwalter_controllers::cluster::election::wire::{Kind, Packet};
    let other = (e + 1) % N;
    let dropped = |s: &Site| {
        s.metric(
            e,
            "verwalter_election_messages_dropped_total",
            "reason=\"bad_auth\"",
        )
    };
    let before = dropped(site);
    let deferrals = site.metric(e, "verwalter_etcd_deferrals_total", "");
    let packet = Packet {
        from: id(other),
        epoch: 1_000,
        schedule: None,
        kind: Kind::Ping,
        lz4_sha1: None,
    };
    let socket = std::net::UdpSocket::bind((site.nodes[other].host.as_str(), 0)).unwrap();
    socket
        .send_to(
            &packet.encode().unwrap(),
            (site.nodes[e].host.as_str(), site.port),
        )
        .unwrap();
    site.wait("the untagged ping dropped", |s| {
        (dropped(s) > before).then_some(())
    });
    assert!(site.is_leader(e), "{}", site.logs());
    assert_eq!(
        site.metric(e, "verwalter_etcd_deferrals_total", ""),
        deferrals,
        "{}",
        site.logs()
    );
}

/// etcd back to the built-in election, the etcd leader last: while the nodes moved are a
/// minority, their elections fail (their pre-votes heard by the etcd leader, which leads on);
/// once they are a majority they elect, the etcd leader hears their leader, steps down,
/// resigns and follows it with the other nodes on etcd. Returns the built-in leader.
fn etcd_to_builtin(site: &mut Site, e: usize) -> usize {
    let deferrals = site.metric(e, "verwalter_etcd_deferrals_total", "");
    let step_downs =
        |s: &Site| s.metric(e, "verwalter_etcd_step_downs_total", "reason=\"deferred\"");
    let stepped = step_downs(site);
    let mut moved: Vec<usize> = Vec::new();
    for g in (0..N).filter(|i| *i != e) {
        site.restart(g, Backend::Builtin);
        moved.push(g);
        if moved.len() < MAJORITY {
            site.wait("the built-in node's elections fail", |s| {
                let started = s.metric(g, "verwalter_elections_started_total", "");
                let heard = s.metric(
                    e,
                    "verwalter_election_messages_received_total",
                    "type=\"pre_vote\"",
                );
                (started >= 2.0 && heard >= 1.0).then_some(())
            });
            assert!(site.is_leader(e), "{}", site.logs());
            assert!(moved.iter().all(|m| !site.is_leader(*m)));
            assert_eq!(
                site.metric(e, "verwalter_etcd_deferrals_total", ""),
                deferrals
            );
            continue;
        }
        let b = site.wait("a built-in leader followed by the nodes on etcd", |s| {
            let b = moved.iter().copied().find(|m| s.is_leader(*m))?;
            let (hash, origin) = s.schedule(b)?;
            let on_etcd = (0..N).filter(|i| !moved.contains(i));
            let follow = on_etcd.into_iter().all(|i| {
                s.defers_to(i).as_ref() == Some(&id(b))
                    && s.schedule(i).is_some_and(|h| h.0 == hash)
            });
            (origin == id(b) && follow && !s.is_leader(e)).then_some(b)
        });
        assert_eq!(step_downs(site), stepped + 1.0, "{}", site.logs());
        assert_eq!(site.etcd_leader_key(), None, "the etcd leader resigned");
        let election = site.json(e, "/v1/election").unwrap();
        assert_eq!(election["leader"], id(b).as_str(), "{election}");
        assert!(
            election["etcd"]["deferring"]["since"].as_u64().is_some(),
            "{election}"
        );
    }
    site.restart(e, Backend::Builtin);
    let (leader, _) = site.wait("one built-in leader, its schedule everywhere", |s| {
        s.converged_now()
    });
    leader
}

#[test]
fn a_cluster_moves_to_etcd_and_back_by_rolling_restarts() {
    let Some(mut site) = Site::start("a_cluster_moves_to_etcd_and_back_by_rolling_restarts", 141)
    else {
        return;
    };
    let e = builtin_to_etcd(&mut site);
    an_untagged_ping_is_dropped(&site, e);
    let b = etcd_to_builtin(&mut site, e);

    // A node that was on etcd, then on the built-in election, on etcd again: etcd still holds
    // the last `P/schedule` (of a leadership whose lease was revoked long ago), and no
    // `P/leader`. The node refuses that value, defers to the built-in leader and holds its
    // schedule.
    let x = (b + 1) % N;
    site.restart(x, Backend::Etcd);
    let held = site.wait("the node back on etcd follows the built-in leader", |s| {
        let theirs = s.schedule(b)?;
        (s.defers_to(x)? == id(b) && s.schedule(x)? == theirs && s.is_leader(b)).then_some(theirs)
    });
    assert_eq!(held.1, id(b));
    assert!(
        site.metric(x, "verwalter_etcd_ignored_total", "reason=\"no_leader\"") >= 1.0,
        "{}",
        site.logs()
    );
    assert!(!site.is_leader(x));
    assert_eq!(site.etcd_leader_key(), None);
}
