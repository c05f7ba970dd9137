//! A TCP proxy standing for a slow link between data centers (docs/datacenters.md): every byte
//! arrives a fixed one-way delay after it was sent (in each direction, without slowing the
//! throughput), and the link can be cut (new connections are closed at once, open ones shut
//! down) and healed. The fixture of the multi-DC process tests; its own test below.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::*;

#[derive(Default)]
struct Link {
    cut: AtomicBool,
    stop: AtomicBool,
    /// Both ends of every proxied connection, shut down by a cut.
    open: Mutex<Vec<TcpStream>>,
    /// Where connections go; until it is set they are closed.
    target: Mutex<Option<SocketAddr>>,
}

/// A proxy listening on `addr` for `target`; stopped when dropped.
pub struct DcProxy {
    pub addr: SocketAddr,
    link: Arc<Link>,
}

impl Drop for DcProxy {
    fn drop(&mut self) {
        self.link.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

impl DcProxy {
    /// Listens on `ip` at a port the system picks (kept while the proxy runs) and forwards to
    /// `target`, each way after `one_way` (a round trip of twice it).
    pub fn start(ip: &str, target: SocketAddr, one_way: Duration) -> DcProxy {
        let proxy = DcProxy::bind(ip, one_way);
        proxy.forward_to(target);
        proxy
    }

    /// Where to forward, once known (a daemon told to name the proxy as its address is started
    /// after the proxy is bound).
    pub fn forward_to(&self, target: SocketAddr) {
        *self.link.target.lock().unwrap() = Some(target);
    }

    /// [`DcProxy::start`] without a target yet: connections are closed until
    /// [`DcProxy::forward_to`].
    pub fn bind(ip: &str, one_way: Duration) -> DcProxy {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let link = Arc::new(Link::default());
        let shared = link.clone();
        std::thread::spawn(move || {
            while !shared.stop.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                if shared.cut.load(Ordering::Relaxed) {
                    continue; // dropped: the client sees the connection closed
                }
                let _ = client.set_nonblocking(false);
                let target = *shared.target.lock().unwrap();
                let Some(Ok(server)) = target.map(TcpStream::connect) else {
                    continue;
                };
                let mut open = shared.open.lock().unwrap();
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                drop(open);
                forward(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    one_way,
                );
                forward(server, client, one_way);
            }
        });
        DcProxy { addr, link }
    }

    /// Cuts the link: open connections are shut down, new ones closed at once.
    pub fn cut(&self) {
        self.link.cut.store(true, Ordering::Relaxed);
        for stream in self.link.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    pub fn heal(&self) {
        self.link.cut.store(false, Ordering::Relaxed);
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read: a reader thread stamps the
/// chunks, a writer thread sends each at its time, so the delay does not lower the throughput.
fn forward(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0
                || tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (at, chunk) in rx {
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[test]
fn the_proxy_carries_a_daemons_api_until_cut_and_again_after_the_heal() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let proxy = DcProxy::start(
        "127.0.0.1",
        SocketAddr::from(([127, 0, 0, 1], daemon.port)),
        Duration::from_millis(20),
    );
    let port = proxy.addr.port();
    let status = |port| http_get(port, "/v1/status").map(|(code, _)| code);
    assert_eq!(status(port), Some(200), "{}", daemon.logs());
    // A connection open when the link is cut is shut down: the read ends, where an idle
    // connection to the daemon would stay open for its idle timeout (30 s).
    let mut open = TcpStream::connect(proxy.addr).unwrap();
    open.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // The proxy has taken the connection once a request through it is answered.
    write!(
        open,
        "GET /v1/status HTTP/1.1\r\nHost: verwalter\r\nConnection: keep-alive\r\n\r\n"
    )
    .unwrap();
    let mut head = [0u8; 12];
    open.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    proxy.cut();
    let mut rest = Vec::new();
    let ended = open.read_to_end(&mut rest);
    assert!(
        ended.is_ok()
            || ended
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the open connection was not cut: {ended:?}"
    );
    assert_eq!(status(port), None, "a new connection passed the cut");
    proxy.heal();
    assert_eq!(status(port), Some(200), "{}", daemon.logs());
}

/// A round trip through the proxy takes at least twice its one-way delay (a lower bound the
/// proxy guarantees, whatever the machine's load).
#[test]
fn a_round_trip_through_the_proxy_takes_twice_its_delay() {
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = echo.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = echo.accept() {
            let mut buf = [0u8; 64];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let proxy = DcProxy::start("127.0.0.1", target, Duration::from_millis(60));
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    let started = Instant::now();
    s.write_all(b"ping").unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping");
    let rtt = started.elapsed();
    assert!(rtt >= Duration::from_millis(120), "{rtt:?}");
}
