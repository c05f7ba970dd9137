//! Wiring of the daemon: build the ports, spawn the controllers and the HTTP server under one
//! shutdown signal.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use tokio::net::{TcpListener, UdpSocket};
use tokio::task::{self, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::actions::ActionQueue;
use verwalter_controllers::cluster::election::ElectionState;
use verwalter_controllers::cluster::election::{self, machine::Machine};
use verwalter_controllers::cluster::replication::ReplicationConfig;
use verwalter_controllers::machinery::clock::{Clock, SystemClock};
use verwalter_controllers::machinery::driver::{Driver, DriverConfig, Reconciler};
use verwalter_controllers::machinery::ports::{AppliedStore, StorageError};
use verwalter_controllers::machinery::store::Field;
use verwalter_controllers::machinery::watchdog::{self, Progress};
use verwalter_controllers::node::{Store, StoreWriter};
use verwalter_controllers::render::RenderController;
use verwalter_controllers::schedule::persist::Persister;
use verwalter_controllers::schedule::scheduler_metrics::SchedulerMetrics;
use verwalter_controllers::schedule::{
    Identity, ScheduleController, ScheduleDeps, ScheduleOutputs,
};
use verwalter_controllers::state::{Actions, Peers, Prefetched, Reports, RolesStatus, Schedule};
use verwalter_controllers::status::Fields;
use verwalter_controllers::storage::cleanup::{CleanupController, SweepError, Sweeper};

use crate::cluster::datacenters::{DcFilter, DcNode};
use crate::cluster::election::{ElectionTask, ElectionWiring};
use crate::cluster::peers::{self, Liveness};
use crate::cluster::replication::{Fetcher, FetcherParts};
use crate::config::{Config, PeerSource};
use crate::http::{self, AppState, NodeInfo};
use crate::inputs::watcher::{self, WatchConfig};
use crate::machinery::systemd::{self, Notify};
use crate::metrics::Metrics;
use crate::render::{self, Applier, ApplierConfig};
use crate::schedule::ConfigDirScheduler;
use crate::schedule::lua::LuaScheduler;
use crate::schedule::wasm::WasmScheduler;
use crate::schedule::wasm::query::QueryHook;
use crate::storage::backups;
use crate::storage::logs::LogDir;
use crate::storage::state_dir::StateDir;
use verwalter_controllers::cluster::datacenters::wire::DcKey;
use verwalter_controllers::cluster::datacenters::{DatacentersPort, View};

/// Why the daemon could not start (exit status 3, as verwalter 0.13's "initial config" errors).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the scheduler thread: {0}")]
    SchedulerThread(#[source] std::io::Error),
    #[error("{0}")]
    Sandbox(String),
    #[error("cannot start the action journal: {0}")]
    Actions(#[source] verwalter_controllers::machinery::ports::JournalError),
    #[error("storage dir: {0}")]
    Upgrade(#[source] crate::storage::upgrade::UpgradeError),
    #[error("cannot use the storage dir {}: {source}", path.display())]
    Storage {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("placement-{0}")]
    Extender(#[source] crate::placement::extender::ExtenderError),
    #[error("{0}")]
    Graph(#[source] crate::ernest::ExecutorError),
    /// `election.backend: etcd`: the client could not be set up.
    #[error("{0}")]
    Etcd(String),
}

/// Why the daemon stopped without being asked to.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Start(#[from] StartError),
    /// A task that runs for the daemon's whole life ended, or panicked.
    #[error("the {} {}", task.name(), if *panicked { "panicked" } else { "ended" })]
    Died { task: Task, panicked: bool },
}

impl RunError {
    /// The exit status: verwalter 0.13's where it has one for the part that died
    /// (docs/running.md#exit-codes).
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Start(_) => 3,
            RunError::Died { task, .. } => task.exit_code(),
        }
    }
}

/// The long-running tasks of the daemon, to say which one died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Http,
    Fetcher,
    Render,
    Schedule,
    Inputs,
    Election,
    Peers,
    Persister,
    Cleanup,
    Actions,
    Notify,
    SchedulerMetrics,
    Extender,
    Graph,
    Events,
    Shadows,
    Datacenters,
}

impl Task {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Task::Http => "HTTP server",
            Task::Fetcher => "schedule fetcher",
            Task::Render => "render controller",
            Task::Schedule => "schedule controller",
            Task::Inputs => "inputs watcher",
            Task::Election => "election",
            Task::Peers => "peer source",
            Task::Persister => "persister",
            Task::Cleanup => "cleanup controller",
            Task::Actions => "action queue",
            Task::Notify => "systemd notifier",
            Task::SchedulerMetrics => "scheduler metrics refresh",
            Task::Extender => "placement extender",
            Task::Graph => "graph executor",
            Task::Events => "deployment events publisher",
            Task::Shadows => "shadow schedulers",
            Task::Datacenters => "data center exchange",
        }
    }

    /// 81-83 and 92 as verwalter 0.13 used them for its listener, fetcher, query (role
    /// variables and rendering) and scheduler threads; 1 for the parts 0.13 had no code for.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Task::Http => 81,
            Task::Fetcher => 82,
            Task::Render => 83,
            Task::Schedule => 92,
            _ => 1,
        }
    }
}

/// The daemon's tasks, each known by its part.
struct Tasks {
    set: JoinSet<()>,
    names: HashMap<task::Id, Task>,
}

impl Tasks {
    fn spawn(&mut self, task: Task, future: impl Future<Output = ()> + Send + 'static) {
        let handle = self.set.spawn(future);
        self.names.insert(handle.id(), task);
    }

    /// Waits for every task. One that ends before `shutdown` is an error: it shuts the others
    /// down and is returned.
    async fn join(mut self, shutdown: &CancellationToken) -> Result<(), RunError> {
        let mut died = None;
        while let Some(joined) = self.set.join_next_with_id().await {
            let (id, panicked) = match joined {
                Ok((id, ())) => (id, false),
                Err(error) => (error.id(), error.is_panic()),
            };
            if shutdown.is_cancelled() || died.is_some() {
                continue;
            }
            let Some(&task) = self.names.get(&id) else {
                continue;
            };
            tracing::error!(
                task = task.name(),
                panicked,
                "A part of the daemon stopped; shutting down."
            );
            died = Some(RunError::Died { task, panicked });
            shutdown.cancel();
        }
        died.map_or(Ok(()), Err)
    }
}

/// The storage dir must be a dir the daemon can list (made when missing): else a stored
/// schedule would silently be taken as none and overwritten.
fn check_storage_dir(dir: &Path) -> Result<(), StartError> {
    let checked = match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "not a directory",
        )),
        Ok(_) => std::fs::read_dir(dir).map(drop),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir),
        Err(error) => Err(error),
    };
    checked.map_err(|source| StartError::Storage {
        path: dir.to_path_buf(),
        source,
    })
}

/// What a driver needs besides itself: where it reports.
struct DriverWiring<'a> {
    tasks: &'a mut Tasks,
    metrics: &'a Arc<Metrics>,
    progress: &'a Progress,
    shutdown: &'a CancellationToken,
}

impl DriverWiring<'_> {
    /// Runs a controller's `driver` as `task` until shutdown, reporting to the metrics and to
    /// the watchdog's records, where its passes may go `step_limit` without a step.
    fn spawn<R: Reconciler>(&mut self, task: Task, driver: Driver<R>, step_limit: Duration) {
        let driver = driver
            .observer(self.metrics.clone())
            .progress(self.progress, step_limit);
        self.tasks.spawn(task, driver.run(self.shutdown.clone()));
    }
}

/// The HTTP listener, bound before anything else starts.
struct Bound {
    listener: TcpListener,
    /// The address bound (with port 0, the port the system picked).
    addr: String,
    port: u16,
    /// The file descriptors the daemon may open, when known.
    nofile: Option<u64>,
}

/// Raises the open-files limit and binds the HTTP port.
async fn bind_http(config: &Config) -> Result<Bound, StartError> {
    let nofile = http::raise_nofile_limit();
    let addr = format!("{}:{}", config.host, config.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|source| StartError::Bind {
            addr: addr.clone(),
            source,
        })?;
    // With port 0 the system picks one; peers and the log need the real one.
    let (addr, port) = match listener.local_addr() {
        Ok(bound) => (bound.to_string(), bound.port()),
        Err(_) => (addr, config.port),
    };
    Ok(Bound {
        listener,
        addr,
        port,
        nofile,
    })
}

/// Checks and upgrades the storage dir, and loads the schedule stored there.
fn open_storage(config: &Config) -> Result<(StateDir, Option<Schedule>), StartError> {
    check_storage_dir(&config.storage_dir)?;
    let state_dir = StateDir::new(&config.storage_dir);
    // Before anything reads or writes them: what verwalter 0.13 left joins our layout.
    crate::storage::upgrade::migrate(&state_dir, &config.log_dir).map_err(StartError::Upgrade)?;
    let removed = state_dir.clean_temp_files();
    if removed > 0 {
        tracing::info!(
            removed,
            "Removed temp files an earlier run left in the storage dir."
        );
    }
    let schedule = match state_dir.load_schedule() {
        Ok(schedule) => schedule,
        Err(error) => {
            tracing::error!(%error, "Cannot use the stored schedule; starting without one.");
            None
        }
    };
    if let Some(s) = &schedule {
        tracing::info!(hash = %s.hash, "Loaded the stored schedule.");
    }
    Ok((state_dir, schedule))
}

/// The store's writers the cluster part owns (a node without peers keeps them unused).
struct ClusterFields {
    peers: Field<Peers>,
    election: Field<ElectionState>,
    reports: Field<Reports>,
    prefetched: Field<Prefetched>,
    replaced: Field<Vec<Schedule>>,
}

/// What the schedule's parts share with the cluster and the HTTP API.
struct Shared {
    schedule: Arc<Field<Option<Schedule>>>,
    /// Both roles save the schedule in force through this one; it retries failed writes.
    persister: Arc<Persister>,
    /// What a follower passes on to the followers that fetch through it (its HTTP serves it).
    relay: Arc<http::RelayBody>,
    /// `/v1/schedule`'s bodies, shared with the election, whose pings announce the LZ4 body's
    /// hash.
    schedule_json: Arc<http::SharedJson<Option<Schedule>>>,
    /// Shared with the HTTP API, which shows it on `/v1/peers`.
    live: Liveness,
    /// The shadow schedulers the schedule controller hands its rounds to (`/v1/shadow`).
    shadows: crate::schedule::shadow::Shadows,
    /// This node's side of the exchange between data centers, when it is in one: fed by the
    /// peer source and the election, served by the HTTP API.
    dc: Option<Arc<DcNode>>,
    /// The election backend's status view, served by the HTTP API (`None` with the built-in
    /// election; written by the etcd task).
    backend_view: http::BackendView,
}

/// What the render part shares with the HTTP API.
struct Rendered {
    logs: Arc<LogDir>,
    log_dirs: BTreeMap<String, PathBuf>,
    query_hook: QueryHook,
}

/// What every part of the daemon is wired to: the settings, the store, the metrics, the clock,
/// and the tasks that run under one shutdown.
struct Wiring<'a> {
    config: &'a Config,
    store: Store,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    tasks: Tasks,
    progress: Progress,
    shutdown: CancellationToken,
}

/// Runs the daemon until `shutdown` is cancelled (or a part of it dies).
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), RunError> {
    let notify = Notify::from_env();
    let progress = notify.progress();
    let bound = bind_http(&config).await?;
    let (state_dir, schedule) = open_storage(&config)?;
    let writer = StoreWriter::new(schedule);
    let store = writer.store();
    let mut keep_unused: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    let StoreWriter {
        inputs,
        peers,
        election,
        actions,
        parents,
        schedule,
        scheduler: status,
        templates,
        force_render,
        roles,
        reports,
        prefetched,
        replaced,
        persist_error,
        scheduler_metrics,
        datacenters,
    } = writer;
    let mut wiring = Wiring {
        config: &config,
        store,
        metrics: Arc::new(Metrics::new()),
        clock: Arc::new(SystemClock),
        tasks: Tasks {
            set: JoinSet::new(),
            names: HashMap::new(),
        },
        progress,
        shutdown: shutdown.clone(),
    };
    wiring
        .spawn_inputs(watcher::Outputs { inputs, templates })
        .await;
    let shared = Shared {
        schedule: Arc::new(schedule),
        persister: wiring.spawn_persister(&state_dir, persist_error),
        relay: Arc::new(http::RelayBody::default()),
        schedule_json: Arc::new(http::SharedJson::schedule()),
        live: Liveness::default(),
        shadows: crate::schedule::shadow::Shadows::new(
            config.config_dir.clone(),
            &config.storage_dir,
            config.limits,
            wiring.clock.clone(),
            wiring.metrics.clone(),
        ),
        dc: dc_node(&config, &bound.addr, &wiring, datacenters, &mut keep_unused),
        backend_view: Default::default(),
    };
    let cluster = ClusterFields {
        peers,
        election,
        reports,
        prefetched,
        replaced,
    };
    let clustered = config.peer_source != PeerSource::None;
    if clustered {
        wiring.spawn_cluster(&bound, cluster, &shared).await?;
    } else {
        wiring.spawn_local_election(cluster, &mut keep_unused);
    }
    if let Some(dc) = &shared.dc {
        let task = crate::cluster::datacenters::follow_election(
            dc.clone(),
            wiring.store.election.clone(),
            wiring.store.peers.clone(),
            shutdown.clone(),
        );
        wiring.tasks.spawn(Task::Datacenters, task);
        let task = crate::cluster::datacenters::run_exchange(dc.clone(), shutdown.clone());
        wiring.tasks.spawn(Task::Datacenters, task);
    }
    wiring.spawn_scheduler_metrics(scheduler_metrics);
    let outputs = ScheduleOutputs {
        schedule: shared.schedule.clone(),
        status,
        parents,
    };
    wiring.spawn_schedule(
        outputs,
        shared.persister.clone(),
        clustered,
        &shared.shadows,
        shared.dc.clone().map(|dc| dc as Arc<dyn DatacentersPort>),
    )?;
    let rendered = wiring.spawn_render(&state_dir, roles)?;
    let action_queue = wiring.spawn_actions(actions, &state_dir)?;
    wiring.spawn_extender(bound.nofile).await?;
    wiring.spawn_ernest()?;
    let (sources, node) = wiring.spawn_http(
        bound,
        &state_dir,
        force_render,
        action_queue,
        rendered,
        shared,
    );
    wiring.spawn_notify(notify, sources, node);

    // Writers nobody else owns yet stay alive until shutdown, so their readers keep working.
    let _keep = keep_unused;
    wiring.tasks.join(&shutdown).await
}

/// This node's side of the exchange between data centers, when it is in one (else the writer
/// of the store's `datacenters` is kept unused).
fn dc_node(
    config: &Config,
    addr: &str,
    wiring: &Wiring<'_>,
    view: Field<Option<View>>,
    keep_unused: &mut Vec<Box<dyn std::any::Any + Send>>,
) -> Option<Arc<DcNode>> {
    let Some(settings) = &config.datacenter else {
        keep_unused.push(Box::new(view));
        return None;
    };
    Some(Arc::new(DcNode::new(
        settings,
        config.election_key.as_ref().map(DcKey::from_election),
        config.machine_id.clone(),
        addr.to_string(),
        wiring.metrics.registry(),
        view,
    )))
}

impl Wiring<'_> {
    /// Where controllers' drivers report.
    fn drivers(&mut self) -> DriverWiring<'_> {
        DriverWiring {
            tasks: &mut self.tasks,
            metrics: &self.metrics,
            progress: &self.progress,
            shutdown: &self.shutdown,
        }
    }

    /// Reads the config dir, then watches it.
    async fn spawn_inputs(&mut self, outputs: watcher::Outputs) {
        let watch = WatchConfig {
            debounce: self.config.debounce,
            ..WatchConfig::default()
        };
        let mut input_watcher = watcher::InputsWatcher::start(
            self.config.config_dir.clone(),
            outputs,
            self.metrics.clone(),
            watch,
        );
        // Read the config dir before any controller starts: the render controller, given a
        // stored schedule and no templates read yet, would fail every role as having no
        // template dir.
        input_watcher.refresh().await;
        self.tasks
            .spawn(Task::Inputs, input_watcher.run(self.shutdown.clone()));
    }

    /// The persister, which writes the schedule in force to the storage dir.
    fn spawn_persister(
        &mut self,
        state_dir: &StateDir,
        error: Field<Option<String>>,
    ) -> Arc<Persister> {
        let persister = Arc::new(Persister::new(Arc::new(state_dir.clone()), error));
        let driver = persister.clone().driver(DriverConfig::default());
        self.drivers()
            .spawn(Task::Persister, driver, watchdog::LOCAL_WORK);
        persister
    }

    /// The peer source, the election over UDP and the schedule fetcher.
    async fn spawn_cluster(
        &mut self,
        bound: &Bound,
        fields: ClusterFields,
        shared: &Shared,
    ) -> Result<(), StartError> {
        let config = self.config;
        #[cfg(feature = "etcd")]
        if let crate::config::Backend::Etcd(settings) = &config.election_backend {
            return self
                .spawn_etcd_cluster(bound, fields, shared, settings)
                .await;
        }
        // The election shares the HTTP port, on UDP, as in verwalter 0.13.
        let udp = bind_udp(&bound.addr).await?;
        self.spawn_peers(bound.port, fields.peers, shared);
        let machine = Machine::new(
            config.machine_id.clone(),
            Instant::now(),
            config.timings.clone(),
            rand::random(),
        )
        .force_leader(config.debug_force_leader);
        let sightings = crate::cluster::replication::SharedSightings::default();
        let announced = Arc::new(crate::cluster::vouch::Announced::default());
        let wiring = ElectionWiring {
            socket: Arc::new(udp),
            store: self.store.clone(),
            out: fields.election,
            reports: fields.reports,
            live: shared.live.clone(),
            clock: self.clock.clone(),
            metrics: self.metrics.clone(),
            sightings: sightings.clone(),
            announced: announced.clone(),
            schedule_json: shared.schedule_json.clone(),
        };
        let task = ElectionTask::new(
            machine,
            wiring,
            config
                .allow_minority_cluster
                .then_some(config.minority_window),
            config.election_key.clone(),
        );
        self.tasks
            .spawn(Task::Election, task.run(self.shutdown.clone()));
        self.spawn_fetcher(
            fields.prefetched,
            fields.replaced,
            shared,
            sightings,
            announced,
            None,
        );
        Ok(())
    }

    /// The schedule fetcher: followers take the leader's schedule, a new leader its parents.
    fn spawn_fetcher(
        &mut self,
        prefetched: Field<Prefetched>,
        replaced: Field<Vec<Schedule>>,
        shared: &Shared,
        sightings: crate::cluster::replication::SharedSightings,
        announced: Arc<crate::cluster::vouch::Announced>,
        inline: Option<Arc<crate::cluster::replication::InlineBodies>>,
    ) {
        let config = self.config;
        let fetcher = Fetcher::new(
            ReplicationConfig {
                relay_fanout: config.relay_fanout,
                ..ReplicationConfig::new(
                    config.machine_id.clone(),
                    config.prefetch,
                    config.timings.heartbeat,
                )
            },
            FetcherParts {
                store: self.store.clone(),
                schedule: shared.schedule.clone(),
                prefetched,
                replaced,
                persister: shared.persister.clone(),
                metrics: self.metrics.clone(),
                live: shared.live.clone(),
                clock: self.clock.clone(),
                sightings,
                relay: shared.relay.clone(),
                announced,
                inline,
            },
        )
        .with_token(config.http.token_for_peers())
        .with_host(&config.hostname);
        self.tasks
            .spawn(Task::Fetcher, fetcher.run(self.shutdown.clone()));
    }

    /// The peer source, leadership on etcd instead of the UDP election (docs/etcd.md), and
    /// the schedule fetcher as with the built-in election.
    #[cfg(feature = "etcd")]
    async fn spawn_etcd_cluster(
        &mut self,
        bound: &Bound,
        fields: ClusterFields,
        shared: &Shared,
        settings: &crate::config::EtcdSettings,
    ) -> Result<(), StartError> {
        use crate::cluster::etcd::{BuiltinEars, EtcdTask, EtcdWiring};
        // The built-in election's port too, listened on only (docs/etcd.md, "Moving between
        // backends").
        let udp = bind_udp(&bound.addr).await?;
        self.spawn_peers(bound.port, fields.peers, shared);
        let inline = Arc::new(crate::cluster::replication::InlineBodies::register(
            self.metrics.registry(),
        ));
        let wiring = EtcdWiring {
            store: self.store.clone(),
            out: fields.election,
            reports: fields.reports,
            clock: self.clock.clone(),
            metrics: self.metrics.clone(),
            view: shared.backend_view.clone(),
            node: self.config.machine_id.clone(),
            addr: bound.addr.clone(),
            builtin: BuiltinEars {
                socket: udp,
                key: self.config.election_key.clone(),
                timeout: self.config.timings.message_timeout_min,
            },
            schedule_json: shared.schedule_json.clone(),
            inline: inline.clone(),
        };
        let (task, answers) = EtcdTask::start(settings.clone(), wiring)
            .await
            .map_err(StartError::Etcd)?;
        self.tasks
            .spawn(Task::Election, task.run(answers, self.shutdown.clone()));
        self.spawn_fetcher(
            fields.prefetched,
            fields.replaced,
            shared,
            Default::default(),
            Default::default(),
            Some(inline),
        );
        Ok(())
    }

    /// The peer source the settings name: cantal or a static list.
    fn spawn_peers(&mut self, port: u16, out: Field<Peers>, shared: &Shared) {
        let live = &shared.live;
        let shutdown = self.shutdown.clone();
        let dc = || {
            let filter = self.config.datacenter.as_ref().map(DcFilter::new);
            filter.map(|f| f.with_node(shared.dc.clone()))
        };
        match &self.config.peer_source {
            PeerSource::Cantal(url) => {
                let cantal = peers::Cantal {
                    url: url.clone(),
                    port,
                    own_id: self.config.machine_id.clone(),
                    dc: dc(),
                };
                let task = peers::run_cantal(
                    cantal,
                    out,
                    live.clone(),
                    self.clock.clone(),
                    self.metrics.clone(),
                    shutdown,
                );
                self.tasks.spawn(Task::Peers, task);
            }
            PeerSource::Static(list) => {
                let task = peers::run_static(
                    list.clone(),
                    dc(),
                    out,
                    live.clone(),
                    self.clock.clone(),
                    shutdown,
                );
                self.tasks.spawn(Task::Peers, task);
            }
            PeerSource::None => unreachable!("clustered"),
        }
    }

    /// No peer source: the node cannot have peers, so it leads itself at once.
    fn spawn_local_election(
        &mut self,
        fields: ClusterFields,
        keep_unused: &mut Vec<Box<dyn std::any::Any + Send>>,
    ) {
        let now = Instant::now();
        let machine = Machine::new(
            self.config.machine_id.clone(),
            now,
            self.config.timings.clone(),
            rand::random(),
        )
        .start_now(now);
        self.tasks.spawn(
            Task::Election,
            election::run_local(
                machine,
                self.store.peers.clone(),
                fields.election,
                self.clock.clone(),
                false,
                self.shutdown.clone(),
            ),
        );
        keep_unused.push(Box::new((
            fields.peers,
            fields.reports,
            fields.prefetched,
            fields.replaced,
        )));
    }

    /// The scheduler's `state.metrics`: the queries of `scheduler/v1/metrics.yaml`, refreshed
    /// while this node leads.
    fn spawn_scheduler_metrics(&mut self, out: Field<SchedulerMetrics>) {
        let refresh = crate::schedule::scheduler_metrics::MetricsRefresh {
            inputs: self.store.inputs.clone(),
            election: self.store.election.clone(),
            out,
            clock: self.clock.clone(),
            metrics: self.metrics.clone(),
        };
        self.tasks
            .spawn(Task::SchedulerMetrics, refresh.run(self.shutdown.clone()));
    }

    /// The schedulers (Lua, and wasm when the config dir has one) and the schedule controller.
    fn spawn_schedule(
        &mut self,
        outputs: ScheduleOutputs,
        persist: Arc<Persister>,
        clustered: bool,
        shadows: &crate::schedule::shadow::Shadows,
        datacenters: Option<Arc<dyn DatacentersPort>>,
    ) -> Result<(), StartError> {
        let config = self.config;
        let lua = LuaScheduler::start(config.config_dir.clone(), config.limits)
            .map_err(StartError::SchedulerThread)?
            .watched(&self.progress);
        // `scheduler/v1/scheduler.wasm`, when it exists, runs instead of `main.lua`.
        let wasm = WasmScheduler::start(config.config_dir.clone(), config.limits.into())
            .map_err(StartError::SchedulerThread)?
            .watched(&self.progress);
        let scheduler = ConfigDirScheduler::new(config.config_dir.clone(), lua, wasm);
        let controller = ScheduleController::new(
            self.store.clone(),
            outputs,
            ScheduleDeps {
                scheduler: Arc::new(scheduler),
                persist,
                clock: self.clock.clone(),
                observer: self.metrics.clone(),
                identity: Identity {
                    id: config.machine_id.clone(),
                    hostname: config.hostname.clone(),
                },
                period: config.scheduler_period,
                datacenters,
            },
        );
        // Shadow schedulers take each round once it is published, on a task of their own.
        let (hook, shadow_task) = shadows.start(self.shutdown.clone());
        self.tasks.spawn(Task::Shadows, shadow_task);
        let controller = controller.with_shadows(hook);
        let controller = Arc::new(if clustered {
            controller.with_prefetch()
        } else {
            controller
        });
        let driver = controller.driver(DriverConfig::default());
        // A run ends within its budget and the scheduler's grace, then the schedule is written.
        let step = config.limits.time + crate::schedule::thread::GRACE + watchdog::LOCAL_WORK;
        self.drivers().spawn(Task::Schedule, driver, step);
        Ok(())
    }

    /// Renders and applies the roles of this node (the render controller), and cleans up after
    /// them (the cleanup controller).
    fn spawn_render(
        &mut self,
        state_dir: &StateDir,
        roles: Field<RolesStatus>,
    ) -> Result<Rendered, StartError> {
        let config = self.config;
        let logs = LogDir::open(&config.log_dir, config.log_limits);
        logs.count_write_errors(self.metrics.deployment_log_write_errors());
        let log_dirs = render::read_log_dirs(&config.config_dir).map_err(StartError::Sandbox)?;
        let applier = Applier::new(
            ApplierConfig {
                config_dir: config.config_dir.clone(),
                staging_dir: state_dir.staging_dir(),
                command_timeout: config.command_timeout,
                dry_run: config.dry_run,
                log_dirs: log_dirs.clone(),
            },
            logs.clone(),
            self.store.templates.clone(),
        );
        if let Err(error) = applier.clean_staging() {
            tracing::warn!(%error, "Cannot remove old staging files.");
        }
        // A dry run applies nothing, so it must not record anything as applied either.
        let applied: Arc<dyn AppliedStore> = if config.dry_run {
            Arc::new(Forgetful)
        } else {
            Arc::new(state_dir.clone())
        };
        let render_log = self.deployment_log(&logs);
        // `scheduler/v1/query.wasm`, when it exists, derives the roles (shared with `/v1/query`).
        let query_hook = QueryHook::new(
            crate::inputs::scheduler_dir(&config.config_dir),
            config.limits.into(),
        );
        let render = Arc::new(
            RenderController::new(
                self.store.clone(),
                config.hostname.clone(),
                roles,
                Arc::new(applier.clone()),
                applied,
                render_log,
                self.clock.clone(),
            )
            .error_policy(config.dependency_failure)
            .role_source(Arc::new(query_hook.clone())),
        );
        // On shutdown a running pass may finish its apply command (bounded by the command's own
        // timeout and the kill of its group) rather than leave a role half applied; the unit's
        // TimeoutStopSec allows for it (docs/packaging.md).
        let driver = render.clone().driver(DriverConfig {
            shutdown_grace: config.command_timeout + crate::render::apply::KILL_GRACE,
            max_concurrent: config.render_parallel,
            ..DriverConfig::default()
        });
        // A step of a render pass is one apply command: its timeout, then the kill of its group.
        let step = config.command_timeout + crate::render::apply::KILL_GRACE + watchdog::MARGIN;
        self.drivers().spawn(Task::Render, driver, step);
        let cleanup = Arc::new(CleanupController::new(
            self.store.clone(),
            render,
            Arc::new(Sweep {
                logs: logs.clone(),
                state_dir: state_dir.clone(),
                applier,
            }),
            self.clock.clone(),
        ));
        let driver = cleanup.driver(DriverConfig::default(), Duration::from_secs(3600));
        self.drivers()
            .spawn(Task::Cleanup, driver, watchdog::LOCAL_WORK);
        Ok(Rendered {
            logs,
            log_dirs,
            query_hook,
        })
    }

    /// Where the render controller reports: the deployment log, and with `deployment-events:`
    /// NATS too.
    fn deployment_log(
        &mut self,
        logs: &Arc<LogDir>,
    ) -> Arc<dyn verwalter_controllers::machinery::ports::DeploymentLog> {
        match &self.config.deployment_events {
            Some(settings) => {
                let (tee, task) = crate::ernest::events::NatsEvents::start(
                    settings,
                    &self.config.hostname,
                    logs.clone(),
                    self.shutdown.clone(),
                );
                self.tasks.spawn(Task::Events, task);
                Arc::new(tee)
            }
            None => logs.clone(),
        }
    }

    /// The queue of operator actions, journaled in the storage dir.
    fn spawn_actions(
        &mut self,
        out: Field<Actions>,
        state_dir: &StateDir,
    ) -> Result<Arc<ActionQueue>, StartError> {
        let action_queue = crate::actions::open(
            out,
            self.store.clone(),
            state_dir,
            self.config.action_limits,
        )
        .map_err(StartError::Actions)?;
        self.tasks.spawn(
            Task::Actions,
            action_queue.clone().run(self.shutdown.clone()),
        );
        Ok(action_queue)
    }

    /// The Kubernetes scheduler extender, on its own address, when the settings ask for it.
    async fn spawn_extender(&mut self, nofile: Option<u64>) -> Result<(), StartError> {
        let Some(setup) = &self.config.placement_extender else {
            return Ok(());
        };
        if !setup.loggers.is_empty() {
            tracing::warn!(
                config = %setup.config.display(),
                "placement-extender.config: loggers: not applied by the daemon (its log filter \
                 is set before the settings are read); use RUST_LOG instead, e.g. \
                 RUST_LOG=info,{}=debug",
                verwalter_placement::loggers::DECISIONS_TARGET
            );
        }
        let store = crate::placement::store::SnapshotStore::new();
        // A quarter of the descriptors at most: the API takes up to half.
        let mut setup = setup.clone();
        setup.limits.max_connections =
            http::connection_cap(setup.limits.max_connections, nofile.map(|n| n / 2));
        let (_, extender_tasks) =
            crate::placement::extender::start(&setup, store, self.shutdown.clone())
                .await
                .map_err(StartError::Extender)?;
        for task in extender_tasks {
            self.tasks.spawn(Task::Extender, task);
        }
        Ok(())
    }

    /// The ernest-style graph executor over NATS, when the settings ask for it; its metrics are
    /// served on this daemon's /metrics.
    fn spawn_ernest(&mut self) -> Result<(), StartError> {
        if let Some(settings) = &self.config.graph {
            let task =
                crate::ernest::start(settings, self.metrics.registry(), self.shutdown.clone())
                    .map_err(StartError::Graph)?;
            self.tasks.spawn(Task::Graph, task);
        }
        Ok(())
    }

    /// The HTTP API on the bound listener; returns what the systemd notifier reports.
    fn spawn_http(
        &mut self,
        bound: Bound,
        state_dir: &StateDir,
        force_render: Field<u64>,
        actions: Arc<ActionQueue>,
        rendered: Rendered,
        shared: Shared,
    ) -> (Fields, Arc<NodeInfo>) {
        let config = self.config;
        let Bound {
            listener,
            addr,
            port,
            nofile,
        } = bound;
        let server_metrics = self.metrics.clone();
        let mut limits = config.http.clone();
        limits.max_connections = http::connection_cap(limits.max_connections, nofile);
        let node = Arc::new(NodeInfo {
            id: config.machine_id.clone(),
            name: config.name.clone(),
            hostname: config.hostname.clone(),
            addr: addr.clone(),
            port,
            debug_force_leader: config.debug_force_leader,
            default_frontend: config.default_frontend.clone(),
            version: http::version(),
        });
        let sources = Fields::new(&self.store);
        let app = http::router(AppState {
            store: self.store.clone(),
            actions,
            logs: Some(rendered.logs),
            log_dirs: Arc::new(rendered.log_dirs),
            backups_dir: state_dir.backups_dir(),
            force_render: Arc::new(force_render),
            metrics: self.metrics.clone(),
            node: node.clone(),
            frontend_dir: config.config_dir.join("frontend"),
            scheduler_dir: crate::inputs::scheduler_dir(&config.config_dir),
            query: rendered.query_hook,
            http: Arc::new(
                http::HttpState::new(limits.clone())
                    .with_relay(shared.relay)
                    .with_schedule_json(shared.schedule_json)
                    .with_shadows(shared.shadows)
                    .with_election_backend(shared.backend_view)
                    .with_shadow_render(http::ShadowDirs::new(
                        config.config_dir.clone(),
                        state_dir.root().join("shadow-render"),
                    )),
            ),
            liveness: shared.live,
            datacenters: shared.dc,
            alive_window: config.minority_window,
        });
        // Tests and scripts started with `--port 0` read the port from this line.
        tracing::info!(
            %addr,
            config_dir = %config.config_dir.display(),
            id = %config.machine_id,
            max_connections = limits.max_connections,
            idle_timeout_ms = limits.idle_timeout.as_millis() as u64,
            "Listening."
        );
        let server_shutdown = self.shutdown.clone();
        self.tasks.spawn(Task::Http, async move {
            http::serve(listener, app, &limits, server_metrics, server_shutdown).await;
        });
        (sources, node)
    }

    /// Tells systemd the daemon is ready (the listener is bound, the inputs read and every part
    /// started), then keeps its status and watchdog up to date.
    fn spawn_notify(&mut self, notify: Notify, sources: Fields, node: Arc<NodeInfo>) {
        let line = systemd::status_line(&sources, &node, None);
        notify.ready(&line);
        if let Some(interval) = notify.watchdog() {
            tracing::info!(
                interval_ms = interval.as_millis() as u64,
                "Pinging the systemd watchdog while the controllers make progress."
            );
        }
        let task = notify.run(
            sources,
            node,
            self.progress.clone(),
            line,
            self.shutdown.clone(),
        );
        self.tasks.spawn(Task::Notify, task);
    }
}

/// Stores no applied hash (`--dry-run`): the render controller still remembers them in memory
/// for the run, and a later real run renders every role.
#[derive(Default)]
struct Forgetful;

impl AppliedStore for Forgetful {
    fn load(&self) -> std::collections::HashMap<String, String> {
        std::collections::HashMap::new()
    }
    fn save(&self, _role: &str, _hash: &str) -> Result<(), StorageError> {
        Ok(())
    }
    fn remove(&self, _role: &str) -> Result<(), StorageError> {
        Ok(())
    }
}

/// Housekeeping for the cleanup controller: log retention and schedule backups.
struct Sweep {
    logs: Arc<LogDir>,
    state_dir: StateDir,
    /// Forgets the variables last logged for roles gone from the node.
    applier: Applier,
}

impl Sweeper for Sweep {
    fn sweep(&self, roles: Option<BTreeSet<String>>) -> BoxFuture<'static, Result<(), SweepError>> {
        let logs = self.logs.clone();
        let state_dir = self.state_dir.clone();
        let applier = self.applier.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                if let Some(keep) = &roles {
                    render::retain_staging(&state_dir.staging_dir(), keep);
                    applier.forget_logged_vars(keep);
                }
                let deleted = logs.retain().map_err(|e| {
                    SweepError::Logs(StorageError::io(logs.path(), "cannot clean up", &e))
                })?;
                if deleted > 0 {
                    tracing::info!(deleted, "Deleted deployment log files past retention.");
                }
                let now = time::OffsetDateTime::now_utc();
                let dir = state_dir.backups_dir();
                backups::maintain(&state_dir.schedule_path(), &dir, now).map_err(|e| {
                    SweepError::Backups(StorageError::io(&dir, "cannot back up", &e))
                })?;
                Ok(())
            })
            .await
            .map_err(|e| SweepError::Interrupted(e.to_string()))?
        })
    }
}

/// The built-in election's UDP socket, on the HTTP port's address.
async fn bind_udp(addr: &str) -> Result<UdpSocket, StartError> {
    UdpSocket::bind(addr)
        .await
        .map_err(|source| StartError::Bind {
            addr: format!("udp {addr}"),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks() -> Tasks {
        Tasks {
            set: JoinSet::new(),
            names: HashMap::new(),
        }
    }

    #[tokio::test]
    async fn a_task_that_ends_or_panics_before_shutdown_stops_the_daemon_with_its_code() {
        let shutdown = CancellationToken::new();
        let mut set = tasks();
        let stop = shutdown.clone();
        set.spawn(Task::Render, async move { stop.cancelled().await });
        set.spawn(Task::Http, async {});
        let died = set.join(&shutdown).await.unwrap_err();
        assert!(shutdown.is_cancelled(), "the others were stopped");
        assert_eq!(died.to_string(), "the HTTP server ended");
        assert_eq!(died.exit_code(), 81);

        let shutdown = CancellationToken::new();
        let mut set = tasks();
        set.spawn(Task::Schedule, async { panic!("bug") });
        let died = set.join(&shutdown).await.unwrap_err();
        assert_eq!(died.to_string(), "the schedule controller panicked");
        assert_eq!(died.exit_code(), 92);
    }

    #[tokio::test]
    async fn tasks_ending_after_shutdown_are_a_clean_stop() {
        let shutdown = CancellationToken::new();
        let mut set = tasks();
        for task in [Task::Http, Task::Fetcher, Task::Render] {
            let stop = shutdown.clone();
            set.spawn(task, async move { stop.cancelled().await });
        }
        shutdown.cancel();
        assert!(set.join(&shutdown).await.is_ok());
    }

    #[test]
    fn the_storage_dir_is_made_when_missing_and_refused_when_not_a_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("a/b");
        check_storage_dir(&missing).unwrap();
        assert!(missing.is_dir());
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        let error = check_storage_dir(&file).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "cannot use the storage dir {}: not a directory",
                file.display()
            )
        );
    }
}
