//! Dependency-graph benchmark (issue 14):
//! - build, check and order a graph of 10,000 vertices and 50,000 edges (`Graph::from_edges` +
//!   `waves`), and run it through `Execution` with instant completions;
//! - the render controller under its driver (the daemon's wiring, 4 roles at once) applying 100
//!   roles that form one `depends_on` chain versus 100 independent roles, each apply running
//!   the command `true`: the time beyond the commands themselves, per role. The chain runs its
//!   commands one after the other, so its overhead is its total minus the sum of its commands.
//!
//! Prints the median, min and max over the rounds. Run: `cargo bench --bench graph`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Map, json};
use tokio_util::sync::CancellationToken;
use verwalter_controllers::graph::{ErrorPolicy, Execution, Graph};
use verwalter_controllers::machinery::clock::SystemClock;
use verwalter_controllers::machinery::driver::DriverConfig;
use verwalter_controllers::machinery::ports::{ApplyError, RoleApplier, RoleJob};
use verwalter_controllers::node::StoreWriter;
use verwalter_controllers::render::RenderController;
use verwalter_controllers::state::Schedule;
use verwalter_controllers::testing::{
    MemoryAppliedStore, RecordingDeploymentLog, layered_graph, templates,
};

const HOST: &str = "alpha";
const ROLES: usize = 100;

const ROUNDS: usize = 21;

fn figures(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{label}: median {:.3} ms (min {:.3}, max {:.3}, {} rounds)",
        ms(samples[samples.len() / 2]),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
}

fn main() {
    graph_figures();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(render_figures());
}

/// Runs `true` for each role and adds up the commands' time.
#[derive(Default)]
struct Counters {
    applied: AtomicUsize,
    command_ns: AtomicUsize,
    done: tokio::sync::Notify,
}

struct TrueApplier(Arc<Counters>);

impl RoleApplier for TrueApplier {
    fn apply(&self, _job: RoleJob) -> BoxFuture<'static, Result<(), ApplyError>> {
        let me = self.0.clone();
        Box::pin(async move {
            let started = Instant::now();
            let status = tokio::process::Command::new("true").status().await;
            me.command_ns
                .fetch_add(started.elapsed().as_nanos() as usize, Ordering::Relaxed);
            status.map_err(|e| ApplyError::Command(e.to_string()))?;
            me.applied.fetch_add(1, Ordering::Relaxed);
            me.done.notify_one();
            Ok(())
        })
    }
}

fn schedule(version: usize, chain: bool) -> Schedule {
    let mut roles = Map::new();
    for i in 0..ROLES {
        let mut role = json!({"version": version});
        if chain && i > 0 {
            role["depends_on"] = json!([format!("r{}", i - 1)]);
        }
        roles.insert(format!("r{i}"), role);
    }
    let data = json!({"vars": {"template": "app/v1"}, "nodes": {HOST: {"roles": roles}}});
    Schedule::new(data, 1_700_000_000_000 + version as u64, "0".repeat(32))
}

async fn render_figures() {
    for chain in [true, false] {
        let writer = StoreWriter::new(None);
        let store = writer.store();
        let StoreWriter {
            schedule: schedule_field,
            templates: templates_field,
            roles,
            ..
        } = writer;
        templates_field.set(templates(&[("app/v1/a.hbs", "h1")]));
        let applier = Arc::new(Counters::default());
        let controller = Arc::new(RenderController::new(
            store,
            HOST.into(),
            roles,
            Arc::new(TrueApplier(applier.clone())),
            Arc::new(MemoryAppliedStore::default()),
            Arc::new(RecordingDeploymentLog::default()),
            Arc::new(SystemClock),
        ));
        let shutdown = CancellationToken::new();
        let driver = controller.driver(DriverConfig::default());
        let task = tokio::spawn(driver.run(shutdown.clone()));
        let (mut totals, mut overheads) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let target = (round + 1) * ROLES;
            applier.command_ns.store(0, Ordering::Relaxed);
            let started = Instant::now();
            schedule_field.set(Some(schedule(round, chain)));
            while applier.applied.load(Ordering::Relaxed) < target {
                applier.done.notified().await;
            }
            let total = started.elapsed();
            let commands = Duration::from_nanos(applier.command_ns.load(Ordering::Relaxed) as u64);
            totals.push(total / ROLES as u32);
            overheads.push(total.saturating_sub(commands) / ROLES as u32);
        }
        shutdown.cancel();
        task.await.unwrap();
        let what = if chain {
            "a 100-role chain"
        } else {
            "100 independent roles"
        };
        figures(&format!("{what}: time per role"), totals);
        if chain {
            figures(
                &format!("{what}: time per role beyond its command"),
                overheads,
            );
        }
    }
}

fn graph_figures() {
    let (vertices, edges) = layered_graph(10_000, 5);
    let mut check = Vec::new();
    let mut execute = Vec::new();
    let mut edge_count = 0;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let graph = Graph::from_edges(
            vertices.iter().map(String::as_str),
            edges.iter().map(|(a, b)| (a.as_str(), b.as_str())),
        )
        .expect("the generated graph is valid");
        let waves = graph.waves().expect("the generated graph is acyclic");
        check.push(started.elapsed());
        edge_count = graph.edge_count();
        assert_eq!(waves.iter().map(Vec::len).sum::<usize>(), vertices.len());

        let started = Instant::now();
        let mut progress = Execution::new(&graph, ErrorPolicy::Halt);
        loop {
            let ready = progress.take_ready();
            if ready.is_empty() {
                break;
            }
            for v in ready {
                progress.complete(&graph, v);
            }
        }
        execute.push(started.elapsed());
        assert_eq!(progress.completed(), vertices.len());
    }
    println!("graph of {} vertices, {edge_count} edges", vertices.len());
    figures("build, check for cycles and order in waves", check);
    figures("execute with instant completions", execute);
}
