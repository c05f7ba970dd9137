//! Serving the app on a socket within limits, so that clients which hold connections without
//! using them cannot take the daemon's descriptors or memory:
//!
//! - a connection that sends no complete request head within the idle timeout is closed (hyper's
//!   header read timeout: it runs on a new connection, between keep-alive requests and while a
//!   head trickles in);
//! - a request body that stalls for the idle timeout ends its request (`408` from the routes
//!   that read bodies): hyper's header timeout does not run while a body is read;
//! - a response write the client does not take for `stream-stall-timeout` (the client stopped
//!   reading, or pipelined requests without reading the answers) closes the connection (see
//!   [`Watched`]): hyper's header timeout does not run while a response is written either;
//! - at most `max-connections` are open (and at most half the descriptor limit, leaving the rest
//!   to files, sockets and commands). One more is taken by closing the oldest idle connection (no
//!   request in progress), else the oldest whose client holds its request up (is not reading a
//!   response, or has not sent all of a request body), so the API still answers while such
//!   clients hold every slot; when every connection is busy otherwise
//!   (long polls, handlers at work), the new one gets a 503 and is closed;
//! - hyper buffers at most [`BUFFER`] per connection, so a client that does not read costs that
//!   and the kernel's socket buffers, not a growing queue.
//!
//! [`serve_on`] is that policy for any router (the scheduler extender serves with it too, over
//! TLS when asked); [`serve`] is the daemon's API on it.
//!
//! `/v1/events` streams have their own cap and stall timeout (see `events.rs`); they close their
//! connection through the [`ConnectionHandle`] every request carries. GraphQL WebSockets
//! (`graphql.rs`) share that cap; once upgraded, a connection leaves the connection count and
//! ends itself when a message waits for the stall timeout.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use verwalter_controllers::http::access;

use crate::config::HttpFileSettings;
use crate::metrics::{ConnectionMetrics, HttpClose, Metrics};

/// Limits of the HTTP server (settings file section `http`).
#[derive(Debug, Clone)]
pub struct HttpSettings {
    pub(crate) max_connections: usize,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_event_streams: usize,
    pub(crate) stream_stall_timeout: Duration,
    /// Lowercase host names the API answers to besides the built-in ones; `*` for any.
    pub(crate) allowed_hosts: Vec<String>,
    /// `http.token-file`'s bearer token, asked of requests `access::needs_token` names.
    pub token: Option<verwalter_controllers::http::access::Token>,
    /// `http.token-for-reads`.
    pub(crate) token_for_reads: bool,
}

/// Far above what operators' browsers, peers and scripts open, far below systemd's default
/// descriptor limit (1024 soft).
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize =
    verwalter_controllers::defaults::HTTP_MAX_CONNECTIONS;
/// Long enough for any client that means to send a request (browsers keep idle connections for
/// at most a few minutes and reopen them at no cost), short enough that idle ones do not pile up.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration =
    verwalter_controllers::defaults::HTTP_IDLE_TIMEOUT;
/// A browser tab holds one stream; this is many operators with several tabs each.
pub(crate) const DEFAULT_MAX_EVENT_STREAMS: usize =
    verwalter_controllers::defaults::HTTP_MAX_EVENT_STREAMS;
/// A reader that took no event for this long is stuck, not slow: events are a few KiB.
pub(crate) const DEFAULT_STREAM_STALL_TIMEOUT: Duration =
    verwalter_controllers::defaults::HTTP_STREAM_STALL_TIMEOUT;
/// hyper's per-connection read and write buffer (its default is ~400 KiB): large request heads
/// and large responses still pass, in pieces, while a client that does not read holds this much.
pub(crate) const BUFFER: usize = 64 << 10;
/// How long open connections get to finish at shutdown (an events stream never does).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Pause after a failed accept (usually out of descriptors), so the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// How long a refused connection is read from after its 503, so that the kernel does not answer
/// the client's unread request with a reset that destroys the 503 before the client reads it.
/// A client reads a 503 in well under this; one that keeps sending is cut off anyway.
const REFUSAL_DRAIN: Duration = Duration::from_millis(500);
/// The most a refused connection is drained of: a request head or a small body.
const REFUSAL_DRAIN_BYTES: usize = 64 << 10;
/// Refused connections drained at once; past that they are closed at once (a flood of new
/// connections must not hold descriptors through the drain).
const MAX_DRAINING: usize = 64;

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_event_streams: DEFAULT_MAX_EVENT_STREAMS,
            stream_stall_timeout: DEFAULT_STREAM_STALL_TIMEOUT,
            allowed_hosts: Vec::new(),
            token: None,
            token_for_reads: verwalter_controllers::defaults::HTTP_TOKEN_FOR_READS,
        }
    }
}

impl HttpSettings {
    /// The settings file's `http` section over the defaults; every problem found.
    pub(crate) fn from_file(file: &HttpFileSettings) -> Result<HttpSettings, Vec<String>> {
        let mut problems = Vec::new();
        for (name, value) in [
            (
                "http.max-connections",
                file.max_connections.map(|v| v as u64),
            ),
            ("http.idle-timeout-ms", file.idle_timeout_ms),
            (
                "http.max-event-streams",
                file.max_event_streams.map(|v| v as u64),
            ),
            ("http.stream-stall-timeout-ms", file.stream_stall_timeout_ms),
        ] {
            if value == Some(0) {
                problems.push(format!("{name}: must be above 0"));
            }
        }
        for (i, host) in file.allowed_hosts.iter().enumerate() {
            if host.is_empty() || host.contains([':', '/', ' ']) {
                problems.push(format!(
                    "http.allowed-hosts[{i}]: {host:?} is not a host name (no port or scheme)"
                ));
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let defaults = HttpSettings::default();
        let ms = |v: Option<u64>, default| v.map_or(default, Duration::from_millis);
        Ok(HttpSettings {
            max_connections: file.max_connections.unwrap_or(defaults.max_connections),
            idle_timeout: ms(file.idle_timeout_ms, defaults.idle_timeout),
            max_event_streams: file.max_event_streams.unwrap_or(defaults.max_event_streams),
            stream_stall_timeout: ms(file.stream_stall_timeout_ms, defaults.stream_stall_timeout),
            allowed_hosts: file
                .allowed_hosts
                .iter()
                .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
                .collect(),
            // Read by `Config::load`: the file is named relative to the settings file.
            token: None,
            token_for_reads: file.token_for_reads.unwrap_or(defaults.token_for_reads),
        })
    }
}

impl HttpSettings {
    /// The token this node sends when it reads from its peers (schedule fetches): its own, when
    /// reads need it (`http.token-for-reads`; every node of the cluster then has the same token
    /// file), else none, so that the token goes over the network only where it must.
    pub(crate) fn token_for_peers(&self) -> Option<verwalter_controllers::http::access::Token> {
        self.token.clone().filter(|_| self.token_for_reads)
    }
}

/// Raises the soft limit of open descriptors to the hard one (systemd starts services with 1024
/// soft, 524288 hard); returns the soft limit in force, if it can be read.
pub(crate) fn raise_nofile_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    // The kernel refuses more than fs.nr_open (1048576 by default) even under an unlimited hard
    // limit.
    const NR_OPEN: u64 = 1 << 20;
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(error) => {
            tracing::warn!(%error, "Cannot read the open file limit.");
            return None;
        }
    };
    let target = hard.min(NR_OPEN);
    if soft >= target {
        tracing::info!(nofile = soft, "Open file limit.");
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
        Ok(()) => {
            tracing::info!(nofile = target, was = soft, "Raised the open file limit.");
            Some(target)
        }
        Err(error) => {
            tracing::warn!(%error, nofile = soft, hard, "Cannot raise the open file limit.");
            Some(soft)
        }
    }
}

pub(crate) use verwalter_controllers::http::access::connection_cap;

/// Closes the connection a request came on (an extension of every request served by [`serve`]).
#[derive(Debug, Clone)]
pub(crate) struct ConnectionHandle(CancellationToken);

impl ConnectionHandle {
    /// A handle that closes nothing (requests that did not come over a socket, in tests).
    #[cfg(test)]
    pub(crate) fn detached() -> ConnectionHandle {
        ConnectionHandle(CancellationToken::new())
    }

    /// Drops the connection at once, whatever it is sending.
    pub(crate) fn close(&self) {
        self.0.cancel();
    }

    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        self.0.is_cancelled()
    }
}

struct Open {
    /// Requests in progress, counting a response until its body is sent or dropped.
    busy: Arc<AtomicUsize>,
    /// A response write is waiting for the client to read (see [`Watched`]).
    blocked: Arc<AtomicBool>,
    /// The request's body has not all come yet (see [`Receiving`]).
    receiving: Arc<AtomicBool>,
    close: CancellationToken,
}

/// Open connections by accept order (the oldest first).
#[derive(Default)]
struct Registry {
    open: Mutex<BTreeMap<u64, Open>>,
}

impl Registry {
    fn len(&self) -> usize {
        self.open.lock().unwrap().len()
    }

    /// Closes the connection [`access::evict`] picks; false when there is none.
    fn close_oldest_idle(&self) -> bool {
        let mut open = self.open.lock().unwrap();
        let idle = access::evict(open.iter().map(|(id, c)| {
            let in_use = access::InUse {
                busy: c.busy.load(Ordering::SeqCst) != 0,
                blocked: c.blocked.load(Ordering::SeqCst),
                receiving: c.receiving.load(Ordering::SeqCst),
            };
            (*id, in_use)
        }));
        match idle.and_then(|id| open.remove(&id)) {
            Some(conn) => {
                conn.close.cancel();
                true
            }
            None => false,
        }
    }
}

/// Removes a connection from the registry and the gauge when its task ends, also by a panic in a
/// handler (hyper polls the handler's future inside the connection's task).
struct Registered {
    registry: Arc<Registry>,
    id: u64,
    metrics: ConnectionMetrics,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.open.lock().unwrap().remove(&self.id);
        self.metrics.closed_one();
    }
}

/// A connection's socket that fails a write the client has not taken for `stall` (the socket
/// buffer stayed full: the client stopped reading), so hyper drops the connection. Only writes
/// count: a long poll waiting with nothing to write is not touched.
struct Watched<IO> {
    io: IO,
    stall: Duration,
    /// Since when the current write has waited, while it waits.
    deadline: Option<Pin<Box<Sleep>>>,
    /// Shown to the registry, which closes such a connection to make room.
    blocked: Arc<AtomicBool>,
    metrics: ConnectionMetrics,
}

impl Watched<()> {
    /// The same watch over `io`.
    fn over<IO>(self, io: IO) -> Watched<IO> {
        Watched {
            io,
            stall: self.stall,
            deadline: None,
            blocked: self.blocked,
            metrics: self.metrics,
        }
    }
}

impl<IO> Watched<IO> {
    /// Passes on what a write returned, counting how long it has been `Pending`.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            if self.deadline.take().is_some() {
                self.blocked.store(false, Ordering::SeqCst);
            }
            return result;
        }
        let stall = self.stall;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        self.blocked.store(true, Ordering::SeqCst);
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.metrics.closed(HttpClose::StalledWrite).inc();
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client took no response data for the stall timeout",
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Whether an accept failed for want of descriptors, which closing an idle connection helps.
fn out_of_descriptors(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Sends the 503 to a connection over the cap, then reads what the client sent for a short
/// while before closing: closing a socket with unread input makes the kernel send a reset, and
/// the client would often see that instead of the 503.
async fn refuse(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A fresh socket's buffer takes these few hundred bytes at once.
    if stream.try_write(busy_response().as_bytes()).is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(REFUSAL_DRAIN, async {
        let mut sink = [0u8; 4096];
        let mut total = 0;
        while total < REFUSAL_DRAIN_BYTES {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    })
    .await;
}

/// Counts a request as in progress until dropped.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(count: &Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::SeqCst);
        Busy(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that holds `guard` until it is sent or dropped: a connection counted busy
/// (here), a share of the extender's body budget (`placement/extender/body.rs`).
pub(crate) struct Holding<G> {
    pub(crate) body: Body,
    pub(crate) _guard: G,
}

impl<G: Unpin> HttpBody for Holding<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body that shows its connection as receiving until all of it has come (or the
/// request gave it up), so that a client trickling a body holds its connection no better than
/// one that does not read (see [`access::evict`]).
struct Receiving {
    body: Incoming,
    flag: Arc<AtomicBool>,
}

impl Receiving {
    fn new(body: Incoming, flag: Arc<AtomicBool>) -> Receiving {
        flag.store(!body.is_end_stream(), Ordering::SeqCst);
        Receiving { body, flag }
    }
}

impl HttpBody for Receiving {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        let done = match &polled {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => self.body.is_end_stream(),
            Poll::Pending => false,
        };
        if done {
            self.flag.store(false, Ordering::SeqCst);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.flag.store(false, Ordering::SeqCst);
    }
}

/// What a connection over the cap gets when no idle one can make room.
fn busy_response() -> String {
    let body = r#"{"error":"too many open connections; retry later"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The limits of one server's connections (the daemon's API: from [`HttpSettings`]; the
/// scheduler extender: from its own settings).
#[derive(Debug, Clone)]
pub(crate) struct ServeLimits {
    /// Open connections at most (as given: the caller applies [`connection_cap`]).
    pub(crate) max_connections: usize,
    /// A connection without a complete request head for this long is closed (a TLS handshake
    /// gets at most [`TLS_HANDSHAKE_TIMEOUT`] of it).
    pub(crate) idle_timeout: Duration,
    /// A response write the client takes nothing of for this long closes the connection.
    pub(crate) stall_timeout: Duration,
}

impl HttpSettings {
    /// The API server's connection limits.
    pub(crate) fn serve_limits(&self) -> ServeLimits {
        ServeLimits {
            max_connections: self.max_connections,
            idle_timeout: self.idle_timeout,
            stall_timeout: self.stream_stall_timeout,
        }
    }
}

/// A TLS handshake that takes longer than this (or the idle timeout, if shorter) is dropped.
pub(crate) const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the daemon's API: `app` on `listener` until `shutdown`, within `settings`
/// (`max_connections` as given: the caller applies [`connection_cap`]); [`serve_on`] with a
/// request body timeout of the idle timeout between pieces of a body.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    settings: &HttpSettings,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    // Only `POST /v1/action` and `/v1/wait_action` read bodies; their handlers answer 408.
    let app = app.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        settings.idle_timeout,
    ));
    let limits = settings.serve_limits();
    serve_on(
        listener,
        app,
        &limits,
        metrics.connection_metrics(),
        None,
        shutdown,
    )
    .await
}

/// Serves `app` on `listener` until `shutdown` within `limits` (the connection policy the
/// module's head describes), over TLS with `tls`. Every request carries its [`ConnectInfo`] and
/// [`ConnectionHandle`]; connections are counted in `metrics`.
pub(crate) async fn serve_on(
    listener: TcpListener,
    app: Router,
    limits: &ServeLimits,
    metrics: ConnectionMetrics,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_buf_size(BUFFER);
    let cap = limits.max_connections;
    let handshake_timeout = limits.idle_timeout.min(TLS_HANDSHAKE_TIMEOUT);
    let registry = Arc::new(Registry::default());
    let mut tasks = JoinSet::new();
    let mut draining = JoinSet::new();
    let mut next_id = 0u64;
    let mut warned_at: Option<tokio::time::Instant> = None;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            Some(_) = draining.join_next(), if !draining.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                accept_failed(&error, &registry, &metrics, &mut warned_at).await;
                continue;
            }
        };
        if registry.len() >= cap {
            if registry.close_oldest_idle() {
                metrics.closed(HttpClose::Evicted).inc();
            } else {
                metrics.closed(HttpClose::Refused).inc();
                turn_away(stream, tls.is_some(), &mut draining);
                continue;
            }
        }
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        let busy = Arc::new(AtomicUsize::new(0));
        let blocked = Arc::new(AtomicBool::new(false));
        let receiving = Arc::new(AtomicBool::new(false));
        let close = CancellationToken::new();
        registry.open.lock().unwrap().insert(
            id,
            Open {
                busy: busy.clone(),
                blocked: blocked.clone(),
                receiving: receiving.clone(),
                close: close.clone(),
            },
        );
        metrics.opened();
        let registered = Registered {
            registry: registry.clone(),
            id,
            metrics: metrics.clone(),
        };
        let handle = ConnectionHandle(close.clone());
        let app = app.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let busy = Busy::enter(&busy);
            let mut request = request.map(|body| Receiving::new(body, receiving.clone()));
            request.extensions_mut().insert(ConnectInfo(peer));
            request.extensions_mut().insert(handle.clone());
            let app = app.clone();
            async move {
                let response = match app.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(response.map(|body| Body::new(Holding { body, _guard: busy })))
            }
        });
        let builder = builder.clone();
        let (stall, metrics) = (limits.stall_timeout, metrics.clone());
        let shutdown = shutdown.clone();
        let tls = tls.clone();
        tasks.spawn(async move {
            let _registered = registered;
            let watched = Watched {
                io: (),
                stall,
                deadline: None,
                blocked,
                metrics,
            };
            // Until the handshake is done the connection is idle: it may be closed to make room.
            let served = match tls {
                None => {
                    let io = watched.over(stream);
                    connection(&builder, io, service, &close, &shutdown).await
                }
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(handshake_timeout, acceptor.accept(stream));
                    match handshake_until(handshake, &close, &shutdown, peer).await {
                        None => return,
                        Some(Ok(stream)) => {
                            let io = watched.over(stream);
                            connection(&builder, io, service, &close, &shutdown).await
                        }
                        Some(Err(error)) => Err(error),
                    }
                }
            };
            if let Err(error) = served {
                tracing::debug!(%error, %peer, "HTTP connection closed on an error.");
            }
        });
    }
    draining.abort_all();
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
}

/// After a failed accept: says so (at most every 10 s), closes an idle connection when out of
/// descriptors, and waits [`ACCEPT_RETRY`] before the next accept.
async fn accept_failed(
    error: &io::Error,
    registry: &Registry,
    metrics: &ConnectionMetrics,
    warned_at: &mut Option<tokio::time::Instant>,
) {
    if warned_at.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
        tracing::warn!(%error, open = registry.len(), "Cannot accept a connection.");
        *warned_at = Some(tokio::time::Instant::now());
    }
    // Out of descriptors, an idle connection gives one back; other errors (a
    // client that reset before the accept, ...) are no reason to close one.
    if out_of_descriptors(error) && registry.close_oldest_idle() {
        metrics.closed(HttpClose::Evicted).inc();
    }
    tokio::time::sleep(ACCEPT_RETRY).await;
}

/// Turns away a connection over the cap: a 503 answered and the request drained in `draining`
/// while it has room, written without waiting when it has none, nothing over TLS.
fn turn_away(stream: TcpStream, tls: bool, draining: &mut JoinSet<()>) {
    if tls {
        // A plain-text 503 means nothing to a TLS client: closed at once.
        drop(stream);
    } else if draining.len() < MAX_DRAINING {
        draining.spawn(refuse(stream));
    } else {
        let _ = stream.try_write(busy_response().as_bytes());
    }
}

/// Waits for a TLS `handshake` (already bounded by its timeout): `None` when the connection is
/// to end without a word (closed to make room, the server shutting down, or a failed handshake,
/// which is logged), the stream, or why it ended (the timeout).
async fn handshake_until<IO>(
    handshake: tokio::time::Timeout<tokio_rustls::Accept<IO>>,
    close: &CancellationToken,
    shutdown: &CancellationToken,
    peer: std::net::SocketAddr,
) -> Option<Result<tokio_rustls::server::TlsStream<IO>, String>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = tokio::select! {
        handshake = handshake => handshake,
        _ = close.cancelled() => return None,
        _ = shutdown.cancelled() => return None,
    };
    match handshake {
        Ok(Ok(stream)) => Some(Ok(stream)),
        Ok(Err(error)) => {
            log_failed_handshake(&error, peer);
            None
        }
        Err(_) => Some(Err("TLS handshake timed out".into())),
    }
}

/// Says why a TLS handshake failed, so that a client set up wrongly is seen: plain HTTP sent to
/// the TLS port (a first byte that is no TLS record type, as `POST` is not) at warn, another
/// TLS error (a protocol or certificate the server does not take) at info, a connection closed
/// before a complete hello (a TCP probe, a port scan) at debug.
fn log_failed_handshake(error: &io::Error, peer: std::net::SocketAddr) {
    let tls = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>());
    match tls {
        Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
            tracing::warn!(
                %peer,
                "Plain HTTP (or another protocol) sent to the TLS port; the connection is closed. \
                 The client must use https:// (kube-scheduler: enableHTTPS: true)."
            );
        }
        Some(tls) => {
            tracing::info!(%peer, error = %tls, "TLS handshake failed; the connection is closed.")
        }
        None => tracing::debug!(%peer, %error, "TLS handshake did not complete."),
    }
}

/// Serves one connection until it ends, `close` (to make room) or `shutdown` (then requests in
/// flight get [`SHUTDOWN_GRACE`]).
async fn connection<IO, S>(
    builder: &hyper::server::conn::http1::Builder,
    io: Watched<IO>,
    service: S,
    close: &CancellationToken,
    shutdown: &CancellationToken,
) -> Result<(), String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = Body> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // With upgrades: the daemon's `/v1/graphql` takes the connection over as a WebSocket (it
    // then leaves this registry, holding an event stream slot instead; its writes stay
    // `Watched`).
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => result.map_err(|e| e.to_string()),
        _ = close.cancelled() => Ok(()),
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_idle_connection_makes_room_and_busy_ones_stay() {
        let registry = Registry::default();
        let mut tokens = Vec::new();
        for id in 0..3 {
            let close = CancellationToken::new();
            let busy = Arc::new(AtomicUsize::new(usize::from(id == 0)));
            tokens.push((close.clone(), busy.clone()));
            let blocked = Arc::new(AtomicBool::new(false));
            registry.open.lock().unwrap().insert(
                id,
                Open {
                    busy,
                    blocked,
                    receiving: Arc::new(AtomicBool::new(false)),
                    close,
                },
            );
        }
        assert!(registry.close_oldest_idle());
        assert!(!tokens[0].0.is_cancelled(), "busy: stays");
        assert!(tokens[1].0.is_cancelled(), "the oldest idle one goes");
        assert!(!tokens[2].0.is_cancelled());
        assert!(registry.close_oldest_idle());
        assert!(!registry.close_oldest_idle(), "only a busy one is left");
        assert_eq!(registry.len(), 1);
    }

    #[test]
    fn settings_take_the_file_over_defaults_and_name_each_bad_value() {
        let file: HttpFileSettings = serde_norway::from_str(
            "max-connections: 10\nidle-timeout-ms: 1500\nallowed-hosts: [Ops.Example.com.]\n",
        )
        .unwrap();
        let settings = HttpSettings::from_file(&file).unwrap();
        assert_eq!(settings.max_connections, 10);
        assert_eq!(settings.idle_timeout, Duration::from_millis(1500));
        assert_eq!(settings.max_event_streams, DEFAULT_MAX_EVENT_STREAMS);
        assert_eq!(settings.allowed_hosts, ["ops.example.com"]);

        let file: HttpFileSettings = serde_norway::from_str(
            "max-connections: 0\nstream-stall-timeout-ms: 0\nallowed-hosts: [\"ops:8379\"]\n",
        )
        .unwrap();
        let problems = HttpSettings::from_file(&file).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("http.max-connections"));
        assert!(problems[1].starts_with("http.stream-stall-timeout-ms"));
        assert!(problems[2].contains("allowed-hosts[0]"));
    }

    /// Serves `app` on a loopback port with `settings`; the address and the server's metrics.
    pub(crate) async fn serving(
        app: Router,
        settings: HttpSettings,
    ) -> (std::net::SocketAddr, Arc<Metrics>, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        let shutdown = CancellationToken::new();
        let (m, s) = (metrics.clone(), shutdown.clone());
        tokio::spawn(async move { serve(listener, app, &settings, m, s).await });
        (addr, metrics, shutdown)
    }

    /// Waits (up to a generous deadline, for loaded machines) until `open` connections are left.
    async fn open_connections_become(metrics: &Metrics, open: i64) {
        let reached = tokio::time::timeout(Duration::from_secs(20), async {
            while metrics.http_connections_open() != open {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(
            reached.is_ok(),
            "{} connections open, expected {open}",
            metrics.http_connections_open()
        );
    }

    /// Settings under which a response that stops moving is given up after 300 ms.
    fn short_stall() -> HttpSettings {
        HttpSettings {
            stream_stall_timeout: Duration::from_millis(300),
            ..HttpSettings::default()
        }
    }

    async fn connect_and_send(addr: std::net::SocketAddr, request: &str) -> TcpStream {
        use tokio::io::AsyncWriteExt;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        stream
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_its_response_is_closed_after_the_stall_timeout() {
        use axum::routing::get;
        // Far more than loopback socket buffers and hyper's buffer hold.
        let app = Router::new().route("/big", get(|| async { vec![b'x'; 64 << 20] }));
        let (addr, metrics, shutdown) = serving(app, short_stall()).await;
        let _reader = connect_and_send(addr, "GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
        open_connections_become(&metrics, 1).await;
        // Well within the idle timeout (30 s), which does not run while a response is written.
        open_connections_become(&metrics, 0).await;
        let stalled = metrics.http_closed(HttpClose::StalledWrite);
        assert_eq!(stalled.get(), 1);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_client_that_pipelines_requests_and_reads_no_answer_is_closed() {
        use axum::routing::get;
        let app = Router::new().route("/mid", get(|| async { vec![b'x'; 256 << 10] }));
        let (addr, metrics, shutdown) = serving(app, short_stall()).await;
        // 64 MiB of answers in all, far more than the socket buffers hold.
        let requests = "GET /mid HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(256);
        let _reader = connect_and_send(addr, &requests).await;
        open_connections_become(&metrics, 1).await;
        open_connections_become(&metrics, 0).await;
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_request_whose_handler_panics_leaves_no_connection_counted() {
        use axum::routing::get;
        use tokio::io::AsyncReadExt;
        let app = Router::new().route(
            "/panic",
            get(|| async {
                if true {
                    panic!("a handler bug");
                }
            }),
        );
        let (addr, metrics, shutdown) = serving(app, HttpSettings::default()).await;
        let mut stream =
            connect_and_send(addr, "GET /panic HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
        open_connections_become(&metrics, 0).await;
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_connection_over_the_cap_reads_its_503() {
        use axum::routing::get;
        use tokio::io::AsyncReadExt;
        let release = Arc::new(tokio::sync::Notify::new());
        let held = release.clone();
        // A long poll: busy without any IO, so it is not evicted.
        let app = Router::new().route(
            "/hold",
            get(move || {
                let held = held.clone();
                async move { held.notified().await }
            }),
        );
        let settings = HttpSettings {
            max_connections: 1,
            ..HttpSettings::default()
        };
        let (addr, metrics, shutdown) = serving(app, settings).await;
        let _holder = connect_and_send(addr, "GET /hold HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
        open_connections_become(&metrics, 1).await;
        for _ in 0..5 {
            // The request is sent before the server answers, so it is unread when it closes.
            let mut refused =
                connect_and_send(addr, "GET /hold HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
            let mut answer = Vec::new();
            refused
                .read_to_end(&mut answer)
                .await
                .expect("the 503 is read, not reset away");
            let answer = String::from_utf8(answer).unwrap();
            assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
            assert!(answer.ends_with("retry later\"}"), "{answer}");
        }
        release.notify_waiters();
        shutdown.cancel();
    }

    #[test]
    fn only_running_out_of_descriptors_closes_a_connection_to_accept() {
        assert!(out_of_descriptors(&io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(out_of_descriptors(&io::Error::from_raw_os_error(
            libc::ENFILE
        )));
        assert!(!out_of_descriptors(&io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
        assert!(!out_of_descriptors(&io::Error::other("other")));
    }

    #[test]
    fn a_connection_whose_client_stopped_reading_makes_room_when_none_is_idle() {
        let registry = Registry::default();
        let mut tokens = Vec::new();
        for id in 0..3 {
            let close = CancellationToken::new();
            let blocked = Arc::new(AtomicBool::new(id == 1));
            tokens.push(close.clone());
            registry.open.lock().unwrap().insert(
                id,
                Open {
                    busy: Arc::new(AtomicUsize::new(1)),
                    blocked,
                    receiving: Arc::new(AtomicBool::new(false)),
                    close,
                },
            );
        }
        assert!(registry.close_oldest_idle());
        assert!(!tokens[0].is_cancelled(), "busy without blocking: stays");
        assert!(tokens[1].is_cancelled(), "its client does not read: goes");
        assert!(!registry.close_oldest_idle(), "long polls are not closed");
    }

    #[test]
    fn the_busy_response_is_well_framed() {
        let text = busy_response();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
    }
}
