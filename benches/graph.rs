//! Dependency-graph benchmark (issue 14): build, check and order a graph of 10,000 vertices and
//! 50,000 edges (`Graph::from_edges` + `waves`), and run it through `Progress` with instant
//! completions.
//!
//! Prints the median, min and max over the rounds. Run: `cargo bench --bench graph`.

use std::time::{Duration, Instant};

use verwalter_controllers::graph::{ErrorPolicy, Graph, Progress};
use verwalter_controllers::testing::layered_graph;

const ROUNDS: usize = 21;

fn figures(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{label}: median {:.2} ms (min {:.2}, max {:.2}, {} rounds)",
        ms(samples[samples.len() / 2]),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
}

fn main() {
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
        let mut progress = Progress::new(&graph, ErrorPolicy::Halt);
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
