//! A mixed cluster: one node of this version and a test double of a verwalter 0.13 node, which
//! speaks 0.13's election packets (the wire encoder of `verwalter_controllers`) and fetches the
//! leader's schedule as 0.13's fetcher does: only when the stamp a peer reports *changes*, and
//! only once it follows that peer (reports that reach it before are noted, not acted on).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;
use verwalter_controllers::cluster::election::wire::{Kind, Packet};
use verwalter_controllers::state::ScheduleStamp;

use crate::cluster::{Node, start_cantal};
use crate::util::*;

/// Generous bound for elections and fetches on a loaded CI machine.
const SOON: Duration = Duration::from_secs(20);
/// The double's machine id: node 2 of the cantal test double's list, on 127.0.0.2.
const DOUBLE_ID: &str = "77985419c732412ea38b94db00000002";

/// How long the double's leader may be silent before it stands for election (0.13's leader
/// timeout is 1.6 to 4 s; the double, which stands only then, takes the longest).
const LEADER_SILENT: Duration = Duration::from_secs(4);

/// What the double is told to do by the test.
enum Command {
    /// Start an election for itself at the next epoch (what a 0.13 node whose leader timed out
    /// does): the leader steps down, and is elected again once the double falls silent.
    Stand,
    /// Listen on this port from now on, where the leader (restarted with another port) serves
    /// too: nodes share one port.
    Move(u16),
}

type Pinged = Arc<Mutex<Option<(Option<ScheduleStamp>, Option<[u8; 20]>)>>>;

/// The 0.13 node's state, as far as the fetch decision goes.
#[derive(Default)]
struct State013 {
    epoch: u64,
    /// The leader it follows (0.13's fetcher is `Replicating` only then).
    leader: Option<String>,
    /// The last stamp each peer reported (0.13's `peer.schedule`): a fetch needs a change.
    reported: HashMap<String, ScheduleStamp>,
    /// The schedule it took from the leader it follows (reset on a leader change, as 0.13's
    /// stable schedule is).
    stable: Option<String>,
    /// Its last known schedule, which its pongs and votes carry.
    last_known: Option<ScheduleStamp>,
}

/// A verwalter 0.13 follower on `127.0.0.2`, answering on the port the cluster shares.
struct Double013 {
    /// The envelopes it fetched, in order.
    fetched: Arc<Mutex<Vec<Value>>>,
    /// The stamp and `lz4_sha1` of the last ping (0.13 ignores the latter; noted for the test).
    pinged: Pinged,
    commands: Sender<Command>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Double013 {
    fn start(port: u16, leader_http: (String, u16)) -> Double013 {
        let socket = bind(port);
        let fetched = Arc::new(Mutex::new(Vec::new()));
        let pinged = Pinged::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (commands, received) = channel();
        let thread = {
            let fetched = fetched.clone();
            let pinged = pinged.clone();
            let stop = stop.clone();
            std::thread::spawn(move || run(socket, leader_http, received, fetched, pinged, stop))
        };
        Double013 {
            fetched,
            pinged,
            commands,
            stop,
            thread: Some(thread),
        }
    }

    fn fetched(&self) -> Vec<Value> {
        self.fetched.lock().unwrap().clone()
    }
}

impl Drop for Double013 {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn send(socket: &UdpSocket, to: SocketAddr, epoch: u64, kind: Kind, stamp: Option<ScheduleStamp>) {
    let packet = Packet {
        from: DOUBLE_ID.to_string(),
        epoch,
        schedule: stamp,
        kind,
        lz4_sha1: None,
    };
    let _ = socket.send_to(&packet.encode().unwrap(), to);
}

/// The double's UDP socket on `127.0.0.2:port`.
fn bind(port: u16) -> UdpSocket {
    let socket = UdpSocket::bind(("127.0.0.2", port)).expect("the double's UDP port");
    // The wait for the next packet, so that the loop sees `stop` and commands.
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    socket
}

fn run(
    mut socket: UdpSocket,
    (leader_host, mut leader_port): (String, u16),
    commands: Receiver<Command>,
    fetched: Arc<Mutex<Vec<Value>>>,
    pinged: Pinged,
    stop: Arc<AtomicBool>,
) {
    let mut st = State013::default();
    let mut buf = [0u8; 2048];
    let mut last_from: Option<SocketAddr> = None;
    // When the leader it follows last pinged it: 0.13's follower stands for election itself
    // once its leader is silent past the leader timeout (a node of this version restarted at
    // epoch 0 learns the cluster's epoch from that vote).
    let mut leader_heard = std::time::Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let mut stand = st.leader.is_some() && leader_heard.elapsed() > LEADER_SILENT;
        while let Ok(command) = commands.try_recv() {
            if let Command::Move(port) = command {
                socket = bind(port);
                leader_port = port;
                continue;
            }
            stand = true;
        }
        if stand {
            st.epoch += 1;
            st.leader = None;
            st.stable = None;
            if let Some(to) = last_from {
                let target = DOUBLE_ID.to_string();
                send(
                    &socket,
                    to,
                    st.epoch,
                    Kind::Vote { target },
                    st.last_known.clone(),
                );
            }
        }
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let Ok(packet) = Packet::decode(&buf[..n]) else {
            continue;
        };
        last_from = Some(from);
        if packet.kind == Kind::Ping {
            *pinged.lock().unwrap() = Some((packet.schedule.clone(), packet.lz4_sha1));
        }
        // 0.13's network loop: the stamp is compared with the one this peer reported last,
        // and the fetcher acts on a change only if it already replicates that leader.
        let changed = packet
            .schedule
            .as_ref()
            .is_some_and(|s| st.reported.get(&packet.from) != Some(s));
        if let Some(stamp) = &packet.schedule {
            st.reported.insert(packet.from.clone(), stamp.clone());
        }
        let following = st.leader.as_deref() == Some(packet.from.as_str());
        // 0.13's election machine, for a node that never stands by itself.
        match &packet.kind {
            Kind::Ping if packet.epoch >= st.epoch => {
                st.epoch = packet.epoch;
                leader_heard = std::time::Instant::now();
                if st.leader.as_deref() != Some(packet.from.as_str()) {
                    st.leader = Some(packet.from.clone());
                    st.stable = None;
                }
                let pong = Kind::Pong { errors: 0 };
                send(&socket, from, st.epoch, pong, st.last_known.clone());
            }
            // 0.13 knows no `pre_vote` field: a pre-vote is a vote to it.
            Kind::Vote { target } | Kind::PreVote { target } if packet.epoch > st.epoch => {
                st.epoch = packet.epoch;
                st.leader = None;
                st.stable = None;
                let confirm = Kind::Vote {
                    target: target.clone(),
                };
                send(&socket, from, st.epoch, confirm, st.last_known.clone());
            }
            _ => {}
        }
        let Some(stamp) = packet.schedule.filter(|_| changed && following) else {
            continue;
        };
        if st.stable.as_deref() == Some(stamp.hash.as_str()) {
            continue;
        }
        // GET /v1/schedule with `Host: verwalter`, taken only with the announced hash.
        let Some((200, body)) = http_get_at(&leader_host, leader_port, "/v1/schedule") else {
            continue;
        };
        let Ok(envelope) = serde_json::from_str::<Value>(&body) else {
            continue;
        };
        if envelope["hash"] != stamp.hash.as_str() {
            continue;
        }
        st.stable = Some(stamp.hash.clone());
        st.last_known = Some(ScheduleStamp {
            timestamp: envelope["timestamp"].as_u64().unwrap_or(0),
            hash: stamp.hash.clone(),
            origin: envelope["origin"].as_str().unwrap_or_default().to_string(),
        });
        fetched.lock().unwrap().push(envelope);
    }
}

/// Issue 28: a node of this version that leads again with unchanged data (a re-election, then a
/// restart) puts its schedule in force under a new timestamp, so a 0.13 follower, which fetches
/// only on a changed stamp, takes each new leadership's schedule (it used to keep rendering
/// whatever it had for as long as that leadership lasted).
#[test]
fn a_013_follower_takes_the_schedule_of_each_leadership_with_unchanged_data() {
    let tmp = tempfile::tempdir().unwrap();
    let (cantal, url) = start_cantal(tmp.path(), &["alpha", "beta"]);
    let _cantal = Reap(cantal);
    let mut alpha = Node::start(0, tmp.path(), 0, &url);
    let port = wait_for(Duration::from_secs(30), || listening_port(&alpha.logs()))
        .unwrap_or_else(|| panic!("alpha does not listen:\n{}", alpha.logs()));
    alpha.port = port;
    let double = Double013::start(port, (alpha.host.clone(), port));

    // With the double's vote alpha leads, and the double fetches its first schedule.
    let first = wait_for(SOON, || double.fetched().first().cloned())
        .unwrap_or_else(|| panic!("the 0.13 double fetched nothing:\n{}", alpha.logs()));
    let election = alpha.json("/v1/election").unwrap();
    assert_eq!(election["is_leader"], true, "{election}");
    let epoch = election["epoch"].as_u64().unwrap();
    assert_eq!(first["origin"], "77985419c732412ea38b94db00000001");
    // Alpha's own render pass of that schedule, once it is over.
    let pass = wait_for(SOON, || {
        let status = alpha.json("/v1/status")?;
        let pass = &status["last_deployment"];
        pass["finished"].is_u64().then(|| pass["id"].clone())
    })
    .unwrap_or_else(|| panic!("alpha rendered nothing:\n{}", alpha.logs()));
    // Its render controller's passes so far, counted while it is idle: nothing wakes it again
    // but a schedule change (an election does not).
    const RENDER_PASSES: &str = "verwalter_controller_passes_total{controller=\"render\"}";
    const RUNNING: &str = "verwalter_controller_running{controller=\"render\"}";
    const WAITING: &str = "verwalter_controller_waiting{controller=\"render\"}";
    let idle = || Some(metric(port, RUNNING)? == 0.0 && metric(port, WAITING)? == 0.0);
    let passes = wait_for(SOON, || idle()?.then(|| metric(port, RENDER_PASSES))?)
        .expect("alpha's render controller goes idle");

    // The double stands for election: alpha votes for it and steps down; the double stays
    // silent, so alpha's vote times out and it is elected again, its data unchanged.
    double.commands.send(Command::Stand).unwrap();
    let second = wait_for(SOON, || double.fetched().get(1).cloned()).unwrap_or_else(|| {
        panic!(
            "the 0.13 double did not fetch the new leadership's schedule; alpha: {:?} {:?}\n{}",
            alpha.json("/v1/election"),
            alpha
                .json("/v1/schedule")
                .map(|s| (s["hash"].clone(), s["timestamp"].clone())),
            alpha.logs()
        )
    });
    let election = alpha.json("/v1/election").unwrap();
    assert_eq!(election["is_leader"], true, "{election}");
    assert!(election["epoch"].as_u64().unwrap() > epoch, "{election}");
    assert_eq!(second["hash"], first["hash"], "the data did not change");
    assert_eq!(second["data"], first["data"]);
    assert_eq!(second["origin"], first["origin"]);
    assert!(
        second["timestamp"].as_u64() > first["timestamp"].as_u64(),
        "{first} {second}"
    );
    assert!(alpha.logs().contains("Restamped the schedule."));
    // The restamp rendered nothing on alpha: once its render controller has looked at the
    // restamped schedule (its passes grew: nothing else woke it) and is idle again, the last
    // render pass is still the first.
    wait_for(SOON, || {
        (metric(port, RENDER_PASSES)? > passes && idle()?).then_some(())
    })
    .expect("the render controller looked at the restamped schedule");
    let status = alpha.json("/v1/status").unwrap();
    assert_eq!(status["last_deployment"]["id"], pass, "{status}");
    // Alpha's pings announce the SHA-1 of the LZ4 body of the restamped schedule, which differs
    // from the earlier stamp's body (followers of this version take a body with that hash
    // without hashing its data).
    let stamp = ScheduleStamp {
        timestamp: second["timestamp"].as_u64().unwrap(),
        hash: second["hash"].as_str().unwrap().to_string(),
        origin: second["origin"].as_str().unwrap().to_string(),
    };
    let body = lz4_body(port);
    let announced = wait_for(SOON, || match double.pinged.lock().unwrap().clone() {
        Some((Some(pinged), body)) if pinged == stamp => body,
        _ => None,
    })
    .expect("a ping with the restamped stamp and a body hash");
    let served: [u8; 20] = <sha1::Sha1 as sha1::Digest>::digest(&body).into();
    assert_eq!(
        announced, served,
        "the announced body hash is the restamped body's"
    );
    // The file in the storage dir holds the stamp in force.
    let stored: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("storage1/schedule/schedule.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(stored["timestamp"], second["timestamp"]);

    // A restart (SIGKILL; another port, which the double follows): alpha loads that schedule,
    // leads again once its epoch passes the double's, and restamps it again.
    drop(alpha);
    let mut alpha = Node::start(0, tmp.path(), 0, &url);
    let port = wait_for(Duration::from_secs(30), || listening_port(&alpha.logs()))
        .unwrap_or_else(|| panic!("alpha does not listen again:\n{}", alpha.logs()));
    alpha.port = port;
    double.commands.send(Command::Move(port)).unwrap();
    let third = wait_for(SOON, || double.fetched().get(2).cloned()).unwrap_or_else(|| {
        panic!(
            "the 0.13 double did not fetch the restarted leader's schedule; alpha: {:?} {:?}\n{}",
            alpha.json("/v1/election"),
            alpha
                .json("/v1/schedule")
                .map(|s| (s["hash"].clone(), s["timestamp"].clone())),
            alpha.logs()
        )
    });
    assert_eq!(third["hash"], first["hash"], "the data did not change");
    assert!(
        third["timestamp"].as_u64() > second["timestamp"].as_u64(),
        "{second} {third}"
    );
    let logs = alpha.logs();
    assert!(logs.contains("Loaded the stored schedule."), "{logs}");
    assert!(logs.contains("Restamped the schedule."), "{logs}");
}

/// The body of alpha's `/v1/schedule` in the `x-verwalter-lz4` coding, as bytes.
fn lz4_body(port: u16) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET /v1/schedule HTTP/1.0\r\nHost: verwalter\r\nAccept-Encoding: x-verwalter-lz4\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let at = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&response[..at]).to_ascii_lowercase();
    assert!(head.contains("content-encoding: x-verwalter-lz4"), "{head}");
    response[at + 4..].to_vec()
}

/// Kills a child process when dropped (a failing test too).
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
