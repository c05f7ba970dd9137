// The page's one state object, created once in app.js and passed to every module that reads or
// changes it, and the questions asked of it (who leads, which roles, which nodes).

/** What the node said last, and what the operator chose on this page. */
export function createState() {
  return {
    status: null,     // /v1/status, from the /v1/events stream
    schedule: null,   // /v1/schedule, fetched when status.schedule_id changes
    peers: [],        // /v1/peers, fetched when the peer list or reports may have changed
    rolesData: null,  // /v1/roles_data, fetched with the schedule and on role failures
    live: false,      // whether the status stream is connected
    // What each of the three was last fetched for (see stream.js); reset when a fetch fails.
    fetchedFor: {schedule: undefined, peers: undefined, roles: undefined},
    // Choices kept across pages and redraws.
    ui: {
      roleFilter: "",              // the filter box of the Roles page
      openPaths: new Set(["$"]),   // the open branches of the Schedule tree
      allVersions: new Set(),      // roles whose Versions table shows every version
    },
  };
}

/** Changes when a render pass starts or ends. */
export function deploymentKey(status) {
  const d = status && status.last_deployment;
  return d ? d.id + ":" + d.finished : "";
}

export function isLeader(state) {
  return !!(state.status && state.status.election_state.is_leader);
}

/** The leader's frontend at `path`, or null when no leader or it is this node. */
export function leaderUrl(state, path) {
  const leader = state.status && state.status.leader;
  if (!leader || isLeader(state) || !leader.addr) return null;
  return "http://" + leader.addr + (path || "/");
}

/** Role names: keys of `roles` and of every node's `roles`, as verwalter counts them. */
export function allRoles(schedule) {
  const names = new Set();
  const d = (schedule && schedule.data) || {};
  Object.keys(d.roles || {}).forEach((r) => names.add(r));
  for (const node of Object.values(d.nodes || {})) {
    Object.keys((node && node.roles) || {}).forEach((r) => names.add(r));
  }
  return [...names].sort();
}

/** Nodes of the schedule that have `role`: [[hostname, entry], ...]. */
export function nodesOf(schedule, role) {
  const nodes = ((schedule && schedule.data) || {}).nodes || {};
  return Object.keys(nodes).sort()
    .filter((n) => nodes[n] && nodes[n].roles && role in nodes[n].roles)
    .map((n) => [n, nodes[n].roles[role]]);
}

/** Whether the schedule gives `role` to this node. */
export function roleIsHere(state, role) {
  return !!state.status && nodesOf(state.schedule, role).some(([n]) => n === state.status.hostname);
}

/** A peer (or this node) by host name, with an address for links. */
export function nodeByHostname(state, hostname) {
  const s = state.status;
  if (s && s.hostname === hostname) {
    return {name: s.name, addr: s.leader && isLeader(state) ? s.leader.addr : location.host, self: true};
  }
  const peer = state.peers.find((p) => p.hostname === hostname);
  return peer ? {name: peer.name, addr: peer.primary_addr} : null;
}
