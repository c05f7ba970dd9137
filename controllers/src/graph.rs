//! Dependency graphs: what may run now, what waits, what a failure stops.
//!
//! A [`Graph`] has named vertices and edges `before -> after` ("`after` depends on `before`").
//! It is built from an edge list or from `depends_on` lists, checked for cycles (a cycle is
//! reported with the vertices on it, in order, so a user can find it) and ordered in waves: every
//! vertex of a wave depends only on vertices of earlier waves, so a wave can run in parallel.
//!
//! [`Execution`] follows one execution: it keeps, per vertex, the number of dependencies not
//! completed yet, so a completion costs O(out-degree) (not a scan of every edge), and it applies
//! the error policy: a failure blocks only what depends on it ([`ErrorPolicy::BlockDependents`]),
//! or halts the execution ([`ErrorPolicy::Halt`]: nothing new starts, what runs finishes). Its
//! [`Execution::outcome`] is `Some` exactly once nothing runs and nothing more can start.

use std::collections::HashMap;

/// Why a graph cannot be executed as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// The vertices on a cycle, in edge order; the first is repeated at the end.
    #[error("dependency cycle: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
    /// `vertex` depends on (or is ordered after) `missing`, which is not a vertex.
    #[error("{vertex:?} depends on {missing:?}, which does not exist")]
    Missing { vertex: String, missing: String },
    /// Two vertices with one name.
    #[error("{0:?} is given twice")]
    Duplicate(String),
}

/// A directed graph over named vertices (indices `0..len()` in insertion order).
#[derive(Debug, Clone, Default)]
pub struct Graph {
    names: Vec<String>,
    index: HashMap<String, usize>,
    /// Per vertex: the vertices that depend on it.
    dependents: Vec<Vec<usize>>,
    /// Per vertex: the vertices it depends on.
    dependencies: Vec<Vec<usize>>,
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds a vertex; a name given twice is an error.
    pub(crate) fn add_vertex(&mut self, name: &str) -> Result<usize, GraphError> {
        if self.index.contains_key(name) {
            return Err(GraphError::Duplicate(name.to_string()));
        }
        let id = self.names.len();
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), id);
        self.dependents.push(Vec::new());
        self.dependencies.push(Vec::new());
        Ok(id)
    }

    /// `after` depends on `before`. An edge given twice counts once.
    pub(crate) fn add_edge(&mut self, before: usize, after: usize) {
        if self.dependents[before].contains(&after) {
            return;
        }
        self.dependents[before].push(after);
        self.dependencies[after].push(before);
    }

    /// A graph of `vertices` and `edges` (`(before, after)` by name). An edge naming a vertex
    /// that is not in `vertices` is an error.
    pub fn from_edges<'a>(
        vertices: impl IntoIterator<Item = &'a str>,
        edges: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Graph, GraphError> {
        let mut graph = Graph::new();
        for name in vertices {
            graph.add_vertex(name)?;
        }
        for (before, after) in edges {
            let missing = |vertex: &str, missing: &str| GraphError::Missing {
                vertex: vertex.to_string(),
                missing: missing.to_string(),
            };
            let b = graph.id(before).ok_or_else(|| missing(after, before))?;
            let a = graph.id(after).ok_or_else(|| missing(before, after))?;
            graph.add_edge(b, a);
        }
        Ok(graph)
    }

    /// A graph from `(name, depends_on)` pairs. Each dependency that is not one of the names is
    /// reported and left out, so that the rest of the graph stays usable.
    pub fn from_depends_on<'a, D>(
        items: impl IntoIterator<Item = (&'a str, D)>,
    ) -> (Graph, Vec<GraphError>)
    where
        D: IntoIterator<Item = &'a str>,
    {
        let mut graph = Graph::new();
        let mut errors = Vec::new();
        let mut pending = Vec::new();
        for (name, deps) in items {
            match graph.add_vertex(name) {
                Ok(id) => pending.push((id, deps)),
                Err(e) => errors.push(e),
            }
        }
        for (id, deps) in pending {
            for dep in deps {
                match graph.id(dep) {
                    Some(before) => graph.add_edge(before, id),
                    None => errors.push(GraphError::Missing {
                        vertex: graph.names[id].clone(),
                        missing: dep.to_string(),
                    }),
                }
            }
        }
        (graph, errors)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn edge_count(&self) -> usize {
        self.dependents.iter().map(Vec::len).sum()
    }

    pub fn id(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    pub fn name(&self, id: usize) -> &str {
        &self.names[id]
    }

    /// The vertices that depend on `id` directly.
    pub fn dependents(&self, id: usize) -> &[usize] {
        &self.dependents[id]
    }

    /// The vertices `id` depends on directly.
    pub(crate) fn dependencies(&self, id: usize) -> &[usize] {
        &self.dependencies[id]
    }

    /// The execution order in waves (see the module docs), or the first cycle found.
    pub fn waves(&self) -> Result<Vec<Vec<usize>>, GraphError> {
        let mut remaining: Vec<usize> = self.dependencies.iter().map(Vec::len).collect();
        let mut wave: Vec<usize> = (0..self.len()).filter(|&v| remaining[v] == 0).collect();
        let mut waves = Vec::new();
        let mut placed = 0;
        while !wave.is_empty() {
            let mut next = Vec::new();
            for &v in &wave {
                for &d in &self.dependents[v] {
                    remaining[d] -= 1;
                    if remaining[d] == 0 {
                        next.push(d);
                    }
                }
            }
            placed += wave.len();
            waves.push(wave);
            wave = next;
        }
        if placed < self.len() {
            let cycle = self.cycles().into_iter().next().unwrap_or_default();
            return Err(GraphError::Cycle(self.named_cycle(&cycle)));
        }
        Ok(waves)
    }

    /// A topological order (the waves one after the other), or the first cycle found.
    pub fn order(&self) -> Result<Vec<usize>, GraphError> {
        Ok(self.waves()?.into_iter().flatten().collect())
    }

    /// One cycle per group of vertices that reach each other (strongly connected component with
    /// more than one vertex, or a vertex depending on itself), each as its vertices in edge
    /// order. Empty when the graph has no cycle.
    pub fn cycles(&self) -> Vec<Vec<usize>> {
        self.cyclic_groups()
            .into_iter()
            .map(|(_, cycle)| cycle)
            .collect()
    }

    /// Each group of vertices that reach each other (sorted), with one cycle through it: every
    /// vertex of a group is on some cycle, not always on the one shown.
    pub fn cyclic_groups(&self) -> Vec<(Vec<usize>, Vec<usize>)> {
        let mut groups = Vec::new();
        for component in self.strongly_connected() {
            let v = component[0];
            if component.len() == 1 && !self.dependents[v].contains(&v) {
                continue;
            }
            let cycle = self.cycle_within(&component);
            groups.push((component, cycle));
        }
        groups
    }

    /// The names of a cycle's vertices, the first repeated at the end (`a -> b -> a`).
    pub fn named_cycle(&self, cycle: &[usize]) -> Vec<String> {
        let mut names: Vec<String> = cycle.iter().map(|&v| self.names[v].clone()).collect();
        if let Some(first) = names.first().cloned() {
            names.push(first);
        }
        names
    }

    /// Every vertex that depends on `id`, directly or not.
    pub(crate) fn downstream(&self, id: usize) -> Vec<usize> {
        let mut seen = vec![false; self.len()];
        let mut stack = vec![id];
        let mut out = Vec::new();
        while let Some(v) = stack.pop() {
            for &d in &self.dependents[v] {
                if !seen[d] {
                    seen[d] = true;
                    out.push(d);
                    stack.push(d);
                }
            }
        }
        out
    }

    /// Tarjan's algorithm, iterative (a deep chain must not overflow the stack).
    fn strongly_connected(&self) -> Vec<Vec<usize>> {
        const UNSEEN: usize = usize::MAX;
        let n = self.len();
        let mut index = vec![UNSEEN; n];
        let mut low = vec![0; n];
        let mut on_stack = vec![false; n];
        let mut stack = Vec::new();
        let mut components = Vec::new();
        let mut next_index = 0;
        // (vertex, position in its dependents list)
        let mut work: Vec<(usize, usize)> = Vec::new();
        for root in 0..n {
            if index[root] != UNSEEN {
                continue;
            }
            work.push((root, 0));
            index[root] = next_index;
            low[root] = next_index;
            next_index += 1;
            stack.push(root);
            on_stack[root] = true;
            while let Some(&mut (v, ref mut pos)) = work.last_mut() {
                if let Some(&w) = self.dependents[v].get(*pos) {
                    *pos += 1;
                    if index[w] == UNSEEN {
                        index[w] = next_index;
                        low[w] = next_index;
                        next_index += 1;
                        stack.push(w);
                        on_stack[w] = true;
                        work.push((w, 0));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                work.pop();
                if let Some(&(parent, _)) = work.last() {
                    low[parent] = low[parent].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut component = Vec::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    component.sort_unstable();
                    components.push(component);
                }
            }
        }
        components.sort_unstable_by_key(|c| c[0]);
        components
    }

    /// A cycle through the lowest vertex of a strongly connected `component` (every vertex of it
    /// reaches every other): a breadth-first search back to the start, inside the component.
    fn cycle_within(&self, component: &[usize]) -> Vec<usize> {
        let start = component[0];
        if self.dependents[start].contains(&start) {
            return vec![start];
        }
        let inside: std::collections::HashSet<usize> = component.iter().copied().collect();
        let mut parent: HashMap<usize, usize> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(v) = queue.pop_front() {
            for &w in &self.dependents[v] {
                if !inside.contains(&w) {
                    continue;
                }
                if w == start {
                    let mut cycle = vec![v];
                    let mut at = v;
                    while at != start {
                        at = parent[&at];
                        cycle.push(at);
                    }
                    cycle.reverse();
                    return cycle;
                }
                if let std::collections::hash_map::Entry::Vacant(e) = parent.entry(w) {
                    e.insert(v);
                    queue.push_back(w);
                }
            }
        }
        component.to_vec()
    }
}

/// What a failure stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorPolicy {
    /// Only what depends on the failed vertex (directly or not) is blocked; the rest goes on.
    #[default]
    BlockDependents,
    /// Nothing new starts after a failure; what runs finishes (ernest's rule).
    Halt,
}

/// Where one vertex stands in an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VertexState {
    /// Dependencies not completed yet.
    Waiting,
    /// May start now.
    Ready,
    Running,
    Completed,
    Failed,
    /// Will not start: something it depends on failed (or the execution halted).
    Blocked,
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// `failed` in the order they failed; `blocked` are the vertices that never started.
    Failed {
        failed: Vec<usize>,
        blocked: Vec<usize>,
    },
}

/// One execution of a [`Graph`] (see the module docs). The graph is passed to each call that
/// needs it, so a `Execution` can be kept next to its graph and serialized on its own.
#[derive(Debug, Clone)]
pub struct Execution {
    policy: ErrorPolicy,
    state: Vec<VertexState>,
    /// Per vertex: dependencies not completed yet.
    remaining: Vec<usize>,
    /// Ready vertices not handed out by [`Execution::take_ready`] yet.
    ready: Vec<usize>,
    running: usize,
    completed: usize,
    failed: Vec<usize>,
    halted: bool,
}

impl Execution {
    pub fn new(graph: &Graph, policy: ErrorPolicy) -> Execution {
        let remaining: Vec<usize> = graph.dependencies.iter().map(Vec::len).collect();
        let mut state = vec![VertexState::Waiting; graph.len()];
        let mut ready = Vec::new();
        for (v, &left) in remaining.iter().enumerate() {
            if left == 0 {
                state[v] = VertexState::Ready;
                ready.push(v);
            }
        }
        ready.reverse();
        Execution {
            policy,
            state,
            remaining,
            ready,
            running: 0,
            completed: 0,
            failed: Vec::new(),
            halted: false,
        }
    }

    pub fn state(&self, v: usize) -> VertexState {
        self.state[v]
    }

    pub fn running(&self) -> usize {
        self.running
    }

    pub fn completed(&self) -> usize {
        self.completed
    }

    pub fn policy(&self) -> ErrorPolicy {
        self.policy
    }

    /// Hands out every vertex that may start now and marks it running, lowest index first.
    /// Nothing after a halt.
    pub fn take_ready(&mut self) -> Vec<usize> {
        if self.halted {
            return Vec::new();
        }
        let mut out = std::mem::take(&mut self.ready);
        out.retain(|&v| self.state[v] == VertexState::Ready);
        out.sort_unstable();
        for &v in &out {
            self.state[v] = VertexState::Running;
        }
        self.running += out.len();
        out
    }

    /// Marks a ready vertex running without [`Execution::take_ready`] (resuming an execution
    /// whose vertex was running when it stopped). `false` when `v` was not ready.
    pub fn start(&mut self, v: usize) -> bool {
        if self.state[v] != VertexState::Ready || self.halted {
            return false;
        }
        self.state[v] = VertexState::Running;
        self.running += 1;
        true
    }

    /// `v` completed: its dependents whose dependencies are all completed become ready. A vertex
    /// that was not running or ready (a duplicate answer, say) changes nothing: `false`.
    pub fn complete(&mut self, graph: &Graph, v: usize) -> bool {
        match self.state[v] {
            VertexState::Running => self.running -= 1,
            VertexState::Ready => {}
            _ => return false,
        }
        self.state[v] = VertexState::Completed;
        self.completed += 1;
        for &d in &graph.dependents[v] {
            self.remaining[d] -= 1;
            if self.remaining[d] == 0 && self.state[d] == VertexState::Waiting {
                self.state[d] = VertexState::Ready;
                self.ready.push(d);
            }
        }
        true
    }

    /// `v` failed: the error policy decides what else stops. `false` when `v` was not running
    /// or ready.
    pub fn fail(&mut self, graph: &Graph, v: usize) -> bool {
        match self.state[v] {
            VertexState::Running => self.running -= 1,
            VertexState::Ready => {}
            _ => return false,
        }
        self.state[v] = VertexState::Failed;
        self.failed.push(v);
        match self.policy {
            ErrorPolicy::BlockDependents => {
                for d in graph.downstream(v) {
                    if matches!(self.state[d], VertexState::Waiting | VertexState::Ready) {
                        self.state[d] = VertexState::Blocked;
                    }
                }
            }
            ErrorPolicy::Halt => {
                self.halted = true;
                for s in &mut self.state {
                    if matches!(s, VertexState::Waiting | VertexState::Ready) {
                        *s = VertexState::Blocked;
                    }
                }
            }
        }
        true
    }

    /// `Some` once nothing runs and nothing more can start; `None` while there is work.
    pub fn outcome(&self) -> Option<Outcome> {
        if self.running > 0 {
            return None;
        }
        if self.completed == self.state.len() {
            return Some(Outcome::Completed);
        }
        // With nothing running, only a ready vertex can move the execution on. (A waiting vertex
        // with none ready is on a cycle, which `Graph::waves` reports before an execution.)
        if !self.halted && self.state.contains(&VertexState::Ready) {
            return None;
        }
        let blocked = (0..self.state.len())
            .filter(|&v| {
                matches!(
                    self.state[v],
                    VertexState::Blocked | VertexState::Waiting | VertexState::Ready
                )
            })
            .collect();
        Some(Outcome::Failed {
            failed: self.failed.clone(),
            blocked,
        })
    }
}

#[cfg(test)]
mod tests;
