//! Wiring of the daemon: build the ports, spawn the controllers and the HTTP server under one
//! shutdown signal.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::driver::DriverConfig;
use verwalter_controllers::election::{self, machine::Machine, machine::Timings};
use verwalter_controllers::ports::{Clock, SystemClock};
use verwalter_controllers::schedule::{Identity, ScheduleController, ScheduleOutputs};
use verwalter_controllers::store::StoreWriter;

use crate::config::Config;
use crate::http::{self, AppState, NodeInfo};
use crate::inputs::watcher::{self, WatchConfig};
use crate::lua::LuaScheduler;
use crate::metrics::Metrics;
use crate::state_dir::StateDir;

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
}

/// Runs the daemon until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), StartError> {
    let addr = format!("{}:{}", config.host, config.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|source| StartError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);

    let state_dir = StateDir::new(&config.storage_dir);
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
    let writer = StoreWriter::new(schedule);
    let store = writer.store();
    let StoreWriter {
        inputs,
        peers,
        election: election_out,
        actions,
        parents,
        schedule,
        scheduler: status,
    } = writer;
    let metrics = Arc::new(Metrics::new());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut tasks = tokio::task::JoinSet::new();

    let watch = WatchConfig {
        debounce: config.debounce,
        ..WatchConfig::default()
    };
    tasks.spawn(watcher::run(
        config.config_dir.clone(),
        inputs,
        metrics.clone(),
        watch,
        shutdown.clone(),
    ));

    // No peer source yet: the node cannot have peers, so it leads itself at once.
    let now = Instant::now();
    let machine = Machine::new(
        config.machine_id.clone(),
        now,
        Timings::default(),
        rand::random(),
    )
    .start_now(now);
    tasks.spawn(election::run_local(
        machine,
        store.peers.clone(),
        election_out,
        clock.clone(),
        false,
        shutdown.clone(),
    ));

    let scheduler = LuaScheduler::start(config.config_dir.clone(), config.limits)
        .map_err(StartError::SchedulerThread)?;
    let controller = Arc::new(ScheduleController::new(
        store.clone(),
        ScheduleOutputs {
            schedule,
            status,
            parents,
        },
        Arc::new(scheduler),
        Arc::new(state_dir),
        clock,
        metrics.clone(),
        Identity {
            id: config.machine_id.clone(),
            hostname: config.hostname.clone(),
        },
        config.scheduler_period,
    ));
    let driver = controller
        .driver(DriverConfig::default())
        .observer(metrics.clone());
    tasks.spawn(driver.run(shutdown.clone()));

    let app = http::router(AppState {
        store,
        metrics,
        node: Arc::new(NodeInfo {
            id: config.machine_id.clone(),
            name: config.name.clone(),
            hostname: config.hostname.clone(),
            addr: addr.clone(),
            debug_force_leader: false,
            default_frontend: "common".into(),
        }),
    });
    tracing::info!(%addr, config_dir = %config.config_dir.display(), id = %config.machine_id, "Listening.");
    let server_shutdown = shutdown.clone();
    tasks.spawn(async move {
        if let Err(error) = axum::serve(listener, app)
            .with_graceful_shutdown(server_shutdown.cancelled_owned())
            .await
        {
            tracing::error!(%error, "HTTP server failed.");
        }
    });

    // Writers nobody else owns yet stay alive until shutdown, so their readers keep working.
    let _keep = (peers, actions);
    while tasks.join_next().await.is_some() {}
    Ok(())
}
