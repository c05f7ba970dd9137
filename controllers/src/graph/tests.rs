use super::*;
use crate::testing::layered_graph as layered;

fn names(graph: &Graph, ids: &[usize]) -> Vec<String> {
    ids.iter().map(|&v| graph.name(v).to_string()).collect()
}

fn waves(graph: &Graph) -> Vec<Vec<String>> {
    graph
        .waves()
        .unwrap()
        .iter()
        .map(|w| {
            let mut w = names(graph, w);
            w.sort();
            w
        })
        .collect()
}

/// network -> firewall -> {web1, web2} -> lb; dns independent.
fn service() -> Graph {
    Graph::from_edges(
        ["network", "firewall", "web1", "web2", "lb", "dns"],
        [
            ("network", "firewall"),
            ("firewall", "web1"),
            ("firewall", "web2"),
            ("web1", "lb"),
            ("web2", "lb"),
        ],
    )
    .unwrap()
}

#[test]
fn waves_put_independent_vertices_together_and_dependents_after_their_dependencies() {
    let g = service();
    assert_eq!(
        waves(&g),
        vec![
            vec!["dns", "network"],
            vec!["firewall"],
            vec!["web1", "web2"],
            vec!["lb"]
        ]
    );
    let order = g.order().unwrap();
    let pos = |n: &str| order.iter().position(|&v| g.name(v) == n).unwrap();
    for (before, after) in [
        ("network", "firewall"),
        ("firewall", "web1"),
        ("web2", "lb"),
    ] {
        assert!(pos(before) < pos(after), "{before} before {after}");
    }
}

#[test]
fn a_cycle_is_named_in_edge_order() {
    let g = Graph::from_edges(
        ["a", "b", "c", "d"],
        [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")],
    )
    .unwrap();
    assert_eq!(
        g.waves(),
        Err(GraphError::Cycle(vec![
            "a".into(),
            "b".into(),
            "c".into(),
            "a".into()
        ]))
    );
    assert_eq!(
        g.waves().unwrap_err().to_string(),
        "dependency cycle: a -> b -> c -> a"
    );
}

#[test]
fn a_vertex_depending_on_itself_is_a_cycle_and_every_separate_cycle_is_found() {
    let g = Graph::from_edges(
        ["x", "p", "q", "free"],
        [("x", "x"), ("p", "q"), ("q", "p")],
    )
    .unwrap();
    let cycles: Vec<Vec<String>> = g.cycles().iter().map(|c| g.named_cycle(c)).collect();
    assert_eq!(
        cycles,
        vec![
            vec!["x".to_string(), "x".into()],
            vec!["p".into(), "q".into(), "p".into()]
        ]
    );
    assert!(service().cycles().is_empty());
}

#[test]
fn a_missing_dependency_is_named_and_the_rest_of_the_graph_is_kept() {
    let (g, errors) = Graph::from_depends_on([
        ("app", vec!["db", "cache"]),
        ("db", vec![]),
        ("worker", vec!["app"]),
    ]);
    assert_eq!(
        errors,
        vec![GraphError::Missing {
            vertex: "app".into(),
            missing: "cache".into()
        }]
    );
    assert_eq!(
        errors[0].to_string(),
        "\"app\" depends on \"cache\", which does not exist"
    );
    assert_eq!(waves(&g), vec![vec!["db"], vec!["app"], vec!["worker"]]);
    assert!(matches!(
        Graph::from_edges(["a"], [("a", "b")]),
        Err(GraphError::Missing { .. })
    ));
    assert_eq!(
        Graph::from_edges(["a", "a"], []).unwrap_err(),
        GraphError::Duplicate("a".into())
    );
}

#[test]
fn an_execution_hands_out_each_vertex_once_when_its_dependencies_completed() {
    let g = service();
    let mut p = Execution::new(&g, ErrorPolicy::Halt);
    let id = |n: &str| g.id(n).unwrap();
    assert_eq!(names(&g, &p.take_ready()), vec!["network", "dns"]);
    assert!(p.take_ready().is_empty(), "nothing is handed out twice");
    assert!(p.complete(&g, id("network")));
    assert!(
        !p.complete(&g, id("network")),
        "a duplicate answer changes nothing"
    );
    assert_eq!(names(&g, &p.take_ready()), vec!["firewall"]);
    p.complete(&g, id("firewall"));
    assert_eq!(names(&g, &p.take_ready()), vec!["web1", "web2"]);
    p.complete(&g, id("web1"));
    assert!(p.take_ready().is_empty(), "lb waits for web2");
    assert_eq!(p.state(id("lb")), VertexState::Waiting);
    p.complete(&g, id("web2"));
    p.complete(&g, id("dns"));
    assert_eq!(p.outcome(), None, "lb is ready, not done");
    assert_eq!(names(&g, &p.take_ready()), vec!["lb"]);
    p.complete(&g, id("lb"));
    assert_eq!(p.outcome(), Some(Outcome::Completed));
}

#[test]
fn halt_starts_nothing_new_after_a_failure_and_ends_once_in_flight_work_finished() {
    let g = service();
    let id = |n: &str| g.id(n).unwrap();
    let mut p = Execution::new(&g, ErrorPolicy::Halt);
    p.take_ready();
    p.complete(&g, id("network"));
    p.take_ready(); // firewall runs, dns still runs
    assert!(p.fail(&g, id("firewall")));
    assert_eq!(p.outcome(), None, "dns is still in flight");
    assert!(p.take_ready().is_empty());
    p.complete(&g, id("dns"));
    assert!(p.take_ready().is_empty());
    let Some(Outcome::Failed { failed, blocked }) = p.outcome() else {
        panic!("{:?}", p.outcome())
    };
    assert_eq!(names(&g, &failed), vec!["firewall"]);
    assert_eq!(names(&g, &blocked), vec!["web1", "web2", "lb"]);
}

#[test]
fn block_dependents_stops_only_what_depends_on_the_failure() {
    let g = Graph::from_edges(
        ["a", "b", "c", "x", "y"],
        [("a", "b"), ("b", "c"), ("x", "y")],
    )
    .unwrap();
    let id = |n: &str| g.id(n).unwrap();
    let mut p = Execution::new(&g, ErrorPolicy::BlockDependents);
    assert_eq!(names(&g, &p.take_ready()), vec!["a", "x"]);
    p.fail(&g, id("a"));
    assert_eq!(p.state(id("c")), VertexState::Blocked);
    assert_eq!(p.outcome(), None);
    p.complete(&g, id("x"));
    assert_eq!(names(&g, &p.take_ready()), vec!["y"], "x's branch goes on");
    p.complete(&g, id("y"));
    assert_eq!(
        p.outcome(),
        Some(Outcome::Failed {
            failed: vec![id("a")],
            blocked: vec![id("b"), id("c")]
        })
    );
}

#[test]
fn a_resumed_execution_starts_a_vertex_that_was_running_without_handing_it_out_again() {
    let g = service();
    let id = |n: &str| g.id(n).unwrap();
    let mut p = Execution::new(&g, ErrorPolicy::Halt);
    for done in ["network", "dns"] {
        assert!(p.complete(&g, id(done)));
    }
    assert!(p.start(id("firewall")));
    assert!(p.take_ready().is_empty());
    p.complete(&g, id("firewall"));
    assert_eq!(names(&g, &p.take_ready()), vec!["web1", "web2"]);
}

#[test]
fn ten_thousand_vertices_and_fifty_thousand_edges_order_and_execute() {
    let (vertices, edges) = layered(10_000, 5);
    let g = Graph::from_edges(
        vertices.iter().map(String::as_str),
        edges.iter().map(|(a, b)| (a.as_str(), b.as_str())),
    )
    .unwrap();
    assert!(g.edge_count() > 45_000, "{}", g.edge_count());
    let order = g.order().unwrap();
    assert_eq!(order.len(), 10_000);
    let mut pos = vec![0; g.len()];
    for (i, &v) in order.iter().enumerate() {
        pos[v] = i;
    }
    for v in 0..g.len() {
        for &d in g.dependents(v) {
            assert!(pos[v] < pos[d]);
        }
    }
    let mut p = Execution::new(&g, ErrorPolicy::Halt);
    let mut executed = 0;
    loop {
        let ready = p.take_ready();
        if ready.is_empty() {
            break;
        }
        for v in ready {
            executed += 1;
            p.complete(&g, v);
        }
    }
    assert_eq!(executed, 10_000);
    assert_eq!(p.outcome(), Some(Outcome::Completed));
    // One back edge makes it a cycle, found and named.
    let mut cyclic = g.clone();
    let (last, first) = (order[order.len() - 1], order[0]);
    cyclic.add_edge(last, first);
    if g.downstream(first).contains(&last) {
        assert!(matches!(cyclic.waves(), Err(GraphError::Cycle(_))));
        assert_eq!(cyclic.cycles().len(), 1);
    }
}

#[test]
fn a_long_chain_is_checked_without_deep_recursion() {
    let n = 200_000;
    let mut g = Graph::new();
    for i in 0..n {
        g.add_vertex(&i.to_string()).unwrap();
    }
    for i in 1..n {
        g.add_edge(i - 1, i);
    }
    g.add_edge(n - 1, 0);
    let cycles = g.cycles();
    assert_eq!(cycles.len(), 1);
    assert_eq!(cycles[0].len(), n);
}
