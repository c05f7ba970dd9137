// The built-in web frontend: one page that routes itself, kept live by the /v1/events stream.
//
// No framework and no build step: DOM built with h(), data from the node's own /v1/ API, pages
// as functions of that data. Docs: docs/frontend.md.
"use strict";

// ---------------------------------------------------------------------------------------------
// DOM helpers

/** Builds an element: h("a", {href: "/x", onclick: f}, "text", child, [more, children]). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

/** Replaces an element's children; null, false and undefined children are left out. */
function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** A link inside the frontend: followed without reloading the page. */
function link(path, ...children) {
  return h("a", {href: BASE + path, "data-link": true}, ...children);
}

function pill(text, kind) {
  return h("span", {class: "pill " + (kind || "")}, text);
}

function card(title, ...children) {
  return h("section", {class: "card"}, title ? h("h2", {}, title) : null, ...children);
}

function kv(pairs) {
  return h("dl", {class: "kv"}, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function table(headers, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows));
}

function short(hash) {
  return hash ? hash.slice(0, 8) : "none";
}

function ago(ms) {
  if (ms === null || ms === undefined) return "never";
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 0) return "just now";
  if (s < 90) return s + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  if (s < 129600) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " days ago";
}

/** A time with its age, kept current by the 1 s ticker. */
function when(ms) {
  if (ms === null || ms === undefined) return h("span", {class: "muted"}, "never");
  return h("time", {datetime: new Date(ms).toISOString(), title: new Date(ms).toISOString(),
    "data-ago": ms}, ago(ms));
}

function json(value) {
  return JSON.stringify(value, null, 2);
}

// ---------------------------------------------------------------------------------------------
// Data: the status stream and what follows from it

/** `/~common/...` when the page is served as an alternative-frontend path, else "". */
const BASE = location.pathname.startsWith("/~common") ? "/~common" : "";

const data = {
  status: null,     // /v1/status, from the stream
  schedule: null,   // /v1/schedule, fetched when status.schedule_id changes
  peers: [],        // /v1/peers, fetched when the peer list or reports may have changed
  rolesData: null,  // /v1/roles_data, fetched with the schedule and on role failures
  live: false,
};

async function getJson(path) {
  const response = await fetch(path, {headers: {Accept: "application/json"}});
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    throw new Error((body && body.error) || (response.status + " " + response.statusText));
  }
  return body;
}

let fetchedFor = {schedule: undefined, peers: undefined, roles: undefined};

/** Fetches what a new status makes stale, then re-renders. */
async function onStatus(status) {
  const previous = data.status;
  data.status = status;
  const jobs = [];
  if (fetchedFor.schedule !== status.schedule_id) {
    fetchedFor.schedule = status.schedule_id;
    jobs.push(status.schedule_id
      ? getJson("/v1/schedule").then((s) => { data.schedule = s; }, () => {})
      : Promise.resolve().then(() => { data.schedule = null; }));
  }
  const peersKey = [status.peers, status.peers_timestamp, status.leader && status.leader.id,
    JSON.stringify(status.failing_nodes)].join("|");
  if (fetchedFor.peers !== peersKey) {
    fetchedFor.peers = peersKey;
    jobs.push(getJson("/v1/peers").then((p) => { data.peers = p; }, () => {}));
  }
  const rolesKey = [status.schedule_id, status.failed_roles.join(","),
    JSON.stringify(status.errors), deploymentKey(status)].join("|");
  if (fetchedFor.roles !== rolesKey && status.schedule_id) {
    fetchedFor.roles = rolesKey;
    jobs.push(getJson("/v1/roles_data").then((r) => { data.rolesData = r; }, () => {}));
  }
  await Promise.all(jobs);
  renderChrome();
  if (current && current.live) current.live(previous);
}

function connect() {
  const events = new EventSource("/v1/events");
  events.addEventListener("status", (e) => {
    setLive(true);
    onStatus(JSON.parse(e.data));
  });
  events.addEventListener("open", () => setLive(true));
  // EventSource reconnects by itself; say so meanwhile. It gives up on an answer other than
  // 200 (503 when the node serves its most streams): then try again later.
  events.addEventListener("error", () => {
    setLive(false);
    if (events.readyState === EventSource.CLOSED) setTimeout(connect, 3000);
  });
}

function setLive(on) {
  data.live = on;
  const el = document.getElementById("live");
  el.className = on ? "on" : "off";
  el.textContent = on ? "live" : "reconnecting";
}

/** Changes when a render pass starts or ends. */
function deploymentKey(status) {
  const d = status && status.last_deployment;
  return d ? d.id + ":" + d.finished : "";
}

function isLeader() {
  return !!(data.status && data.status.election_state.is_leader);
}

/** The leader's frontend at `path`, or null when no leader or it is this node. */
function leaderUrl(path) {
  const leader = data.status && data.status.leader;
  if (!leader || isLeader() || !leader.addr) return null;
  return "http://" + leader.addr + (path || "/");
}

/** Role names: keys of `roles` and of every node's `roles`, as verwalter counts them. */
function allRoles(schedule) {
  const names = new Set();
  const d = (schedule && schedule.data) || {};
  Object.keys(d.roles || {}).forEach((r) => names.add(r));
  for (const node of Object.values(d.nodes || {})) {
    Object.keys((node && node.roles) || {}).forEach((r) => names.add(r));
  }
  return [...names].sort();
}

/** Nodes of the schedule that have `role`: [[hostname, entry], ...]. */
function nodesOf(schedule, role) {
  const nodes = ((schedule && schedule.data) || {}).nodes || {};
  return Object.keys(nodes).sort()
    .filter((n) => nodes[n] && nodes[n].roles && role in nodes[n].roles)
    .map((n) => [n, nodes[n].roles[role]]);
}

/** A peer (or this node) by host name, with an address for links. */
function nodeByHostname(hostname) {
  const s = data.status;
  if (s && s.hostname === hostname) return {name: s.name, addr: s.leader && isLeader() ? s.leader.addr : location.host, self: true};
  const peer = data.peers.find((p) => p.hostname === hostname);
  return peer ? {name: peer.name, addr: peer.primary_addr} : null;
}

// ---------------------------------------------------------------------------------------------
// Actions: buttons the schedule declares

/** Sends an action to the leader and shows what became of it in `results`. */
async function press(button, action, confirmText, results) {
  if (confirmText && !window.confirm(confirmText === true ? "Are you sure?" : confirmText)) return;
  const line = h("div", {class: "result pending"}, "Sent " + describe(action) + "…");
  results.prepend(line);
  button.disabled = true;
  try {
    const response = await fetch("/v1/wait_action", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify(action),
    });
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (response.status === 200) {
      const bad = body && typeof body === "object" && body.error;
      line.className = "result " + (bad ? "bad" : "ok");
      line.textContent = describe(action) + ": " +
        (bad ? body.error : (body && body.ok) || JSON.stringify(body));
    } else if (response.status === 204) {
      line.className = "result ok";
      line.textContent = describe(action) + ": done, the schedule took it";
    } else {
      line.className = "result bad";
      line.textContent = describe(action) + ": " + ((body && body.error) || response.statusText);
    }
  } catch (e) {
    line.className = "result bad";
    line.textContent = describe(action) + ": " + e.message;
  } finally {
    button.disabled = false;
  }
}

function describe(action) {
  const b = action.button || {};
  return [b.role, b.action, b.version, b.daemon && "daemon " + b.daemon, b.host && "on " + b.host]
    .filter(Boolean).join(" ");
}

/** A button sending `action`; disabled with a pointer to the leader on other nodes. */
function actionButton(title, action, confirmText, results) {
  const button = h("button", {type: "button", "data-action": action.button.action,
    "data-version": action.button.version, title: describe(action)}, title);
  if (!isLeader()) {
    button.disabled = true;
    button.title = "Actions are taken by the leader only";
  }
  button.addEventListener("click", () => press(button, action, confirmText, results));
  return button;
}

/** On a follower: where the buttons work. */
function leaderNotice() {
  if (isLeader()) return null;
  const url = leaderUrl(location.pathname + location.search);
  return h("div", {class: "banner warn", id: "leader-notice"}, "Actions are taken by the leader only. ",
    url ? h("a", {href: url}, "Open this page on the leader (" + data.status.leader.name + ")")
      : "No leader is known right now.");
}

async function forceRender(button, results) {
  button.disabled = true;
  const line = h("div", {class: "result pending"}, "Re-rendering every role of this node…");
  results.prepend(line);
  try {
    const response = await fetch("/v1/force_render_all", {method: "POST"});
    line.className = "result " + (response.ok ? "ok" : "bad");
    line.textContent = response.ok ? "Every role of this node is rendered again (see Logs)."
      : "Re-render refused: " + response.status;
  } catch (e) {
    line.className = "result bad";
    line.textContent = "Re-render failed: " + e.message;
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------------------------------------
// The header and banners, on every page

function renderChrome() {
  const s = data.status;
  if (!s) return;
  document.title = "verwalter: " + s.hostname;
  document.getElementById("version").textContent = s.version + " on " + s.hostname;
  document.getElementById("count-roles").textContent = s.roles;
  document.getElementById("count-nodes").textContent = s.peers + 1;
  const badge = document.getElementById("errors-badge");
  badge.hidden = s.num_errors === 0;
  badge.textContent = s.failed_roles.length === 1 && s.num_errors === 1
    ? "role " + s.failed_roles[0] + " failing" : s.num_errors + (s.num_errors === 1 ? " error" : " errors");
  const leader = document.getElementById("leader-badge");
  fill(leader);
  if (!s.leader) {
    leader.append(h("a", {href: "/v1/election.pretty"}, "No leader"), " · " + s.schedule_status);
  } else if (isLeader()) {
    leader.append("Leader: this node · " + s.schedule_status);
  } else {
    leader.append("Leader: ", h("a", {href: leaderUrl("/")}, s.leader.name), " · " + s.schedule_status);
  }
  const banners = document.getElementById("banners");
  fill(banners);
  if (s.failed_roles.length) {
    banners.append(h("div", {class: "banner bad", id: "failing-roles"}, "Failing roles on this node: ",
      s.failed_roles.map((r) => link("/logs?filter=" + encodeURIComponent(r), r))));
  }
  if (s.failing_nodes && s.failing_nodes.length) {
    banners.append(h("div", {class: "banner bad", id: "failing-nodes"}, "Failing nodes: ",
      s.failing_nodes.map((n) => h("a", {href: n.addr ? "http://" + n.addr + "/" : "#",
        title: n.errors + " error(s)"}, n.name))));
  }
  if (s.debug_force_leader) {
    banners.append(h("div", {class: "banner warn"}, "Debugging: this node runs with --debug-force-leader."));
  }
}

// ---------------------------------------------------------------------------------------------
// Pages. Each returns {node, live?(previous status), leave?()}.

function overviewPage() {
  const root = h("div", {id: "overview"});
  const results = h("div", {class: "results"});
  function draw() {
    const s = data.status;
    if (!s) return;
    const sched = data.schedule;
    const d = (sched && sched.data) || {};
    const leader = s.leader;
    const roles = allRoles(sched);
    const failing = new Set(s.failed_roles);
    const rerender = h("button", {type: "button", id: "force-render"}, "Re-render all roles");
    rerender.addEventListener("click", () => forceRender(rerender, results));
    fill(root, 
      h("div", {class: "grid"},
        card("Leader",
          h("div", {class: "big", id: "leader"}, leader ? leader.name : "No leader"),
          leader ? kv([["host", leader.hostname], ["address", leader.addr || "unknown"],
            ["this node", isLeader() ? "is the leader" : "follows it"]])
            : h("p", {class: "muted"}, "An election is going on (", link("/nodes", "nodes"), ").")),
        card("Schedule",
          h("div", {class: "big mono", id: "schedule-hash", title: s.schedule_id || ""}, short(s.schedule_id)),
          kv([["made", sched ? when(sched.timestamp) : "—"],
            ["status", pill(s.schedule_status, s.schedule_status === "ok" ? "ok" : "warn")],
            ["by", sched ? originName(sched.origin) : "—"]])),
        card("This node",
          h("div", {class: "big"}, s.name),
          kv([["host", s.hostname], ["id", h("span", {class: "mono"}, s.id)],
            ["election", (s.election_state.is_leader ? "leader" : s.election_state.is_stable ? "follower" : "unstable")
              + ", epoch " + s.election_state.epoch],
            ["stable since", when(s.last_stable_timestamp)]])),
        card("Peers",
          h("div", {class: "big"}, String(s.peers)),
          kv([["failing", String((s.failing_nodes || []).length)],
            ["list changed", when(s.peers_timestamp)]]),
          link("/nodes", "All nodes"))),
      Object.keys(s.errors).length ? card("Errors",
        table(["Where", "Problem"], Object.entries(s.errors).map(([k, v]) =>
          h("tr", {}, h("td", {class: "mono"}, k), h("td", {}, h("pre", {}, v)))), {id: "errors"})) : null,
      card("Roles",
        roles.length ? table(["Role", "Version", "Nodes", "Here"], roles.map((r) => {
          const info = (d.roles || {})[r] || {};
          const here = nodesOf(sched, r).some(([n]) => n === s.hostname);
          return h("tr", {},
            h("td", {}, link("/roles/" + encodeURIComponent(r), r)),
            h("td", {}, info.version !== undefined ? String(info.version) : h("span", {class: "muted"}, "—")),
            h("td", {}, String(nodesOf(sched, r).length)),
            h("td", {}, !here ? h("span", {class: "muted"}, "no") : failing.has(r)
              ? link("/logs?filter=" + encodeURIComponent(r), pill("failing", "bad")) : pill("ok", "ok")));
        }), {id: "roles-table"}) : h("p", {class: "muted"}, s.schedule_id ? "The schedule has no roles." : "No schedule yet."),
        h("div", {class: "toolbar", style: "margin-top:10px"}, rerender), results),
      Array.isArray(d.changes) && d.changes.length
        ? card("Changes in this schedule", h("ul", {}, d.changes.map((c) => h("li", {}, String(c))))) : null);
  }
  draw();
  return {node: root, live: draw};
}

function originName(origin) {
  const s = data.status;
  if (s && origin === s.id) return s.name;
  const peer = data.peers.find((p) => p.id === origin);
  return peer ? peer.name : h("span", {class: "mono"}, short(origin));
}

// Roles ----------------------------------------------------------------------------------------

let roleFilter = "";

function rolesPage(role) {
  const root = h("div", {class: "split"});
  const side = h("div", {class: "side"});
  const list = h("div", {id: "role-list"});
  const filter = h("input", {type: "search", placeholder: "Filter roles", value: roleFilter});
  filter.addEventListener("input", () => { roleFilter = filter.value; drawList(); });
  const results = h("div", {class: "results"});
  const rerender = h("button", {type: "button", id: "force-render"}, "Re-render all roles");
  rerender.addEventListener("click", () => forceRender(rerender, results));
  side.append(filter, list, h("div", {style: "margin-top:12px"}, rerender), results);
  const content = h("div", {id: "role"});
  root.append(side, content);
  // Kept across redraws: a press changes the schedule, which redraws the page.
  const actionResults = h("div", {class: "results", id: "action-results"});
  let deployments = null;

  function drawList() {
    const failing = new Set((data.status && data.status.failed_roles) || []);
    const needle = roleFilter.toLowerCase();
    fill(list, ...allRoles(data.schedule).filter((r) => r.toLowerCase().includes(needle)).map((r) => {
      const a = link("/roles/" + encodeURIComponent(r), r, failing.has(r) ? pill("failing", "bad") : null);
      if (r === role) a.classList.add("active");
      return a;
    }));
  }

  function draw() {
    drawList();
    if (!role) {
      fill(content, card(null, h("p", {class: "muted"},
        allRoles(data.schedule).length ? "Pick a role."
          : data.status ? "The schedule has no roles yet." : "Loading the schedule…")));
      return;
    }
    fill(content, ...rolePage(role, deployments, actionResults));
  }

  // Deployments of the role on this node: only where the schedule gives it this node (a node
  // that never rendered anything has no log index, and the failed fetch would be noise).
  const here = () => data.status && nodesOf(data.schedule, role).some(([n]) => n === data.status.hostname);
  let requested = false;
  const reload = () => (requested = true) && loadIndex().then((entries) => { deployments = entries; draw(); },
    (e) => { deployments = e; draw(); });
  draw();
  return {node: root, live: (prev) => {
    // Redraw on what the role page shows; keep open buttons' results otherwise.
    const s = data.status;
    if (role && here() && (!requested || (prev && deploymentKey(prev) !== deploymentKey(s)))) reload();
    if (!prev || prev.schedule_id !== s.schedule_id || prev.failed_roles.join() !== s.failed_roles.join()
        || prev.election_state.is_leader !== s.election_state.is_leader || deploymentKey(prev) !== deploymentKey(s)) {
      draw();
    }
  }};
}

function rolePage(role, deployments, results) {
  const s = data.status;
  const sched = data.schedule;
  const d = (sched && sched.data) || {};
  const info = (d.roles || {})[role];
  const out = [h("h1", {}, info && info.title ? info.title + " (" + role + ")" : role,
    " ", info && info.badge ? pill(String(info.badge)) : null)];
  if (info === undefined && !nodesOf(sched, role).length) {
    // Until the first status and its schedule arrive there is nothing to say "no" from.
    const loading = !s || (s.schedule_id && (!sched || sched.hash !== s.schedule_id));
    out.push(card(null, loading
      ? h("p", {class: "muted", id: "role-loading"}, "Loading the schedule…")
      : h("p", {}, "No role ", h("code", {}, role), " in the schedule in force.")));
    return out;
  }
  const frontend = (info && info.frontend) || {};
  const globalActions = Array.isArray(info && info.global_actions) ? info.global_actions : [];
  const daemonActions = Array.isArray(info && info.daemon_actions) ? info.daemon_actions : [];
  const versions = Array.isArray(info && info.versions) ? info.versions : [];
  const buttonsAnywhere = globalActions.length || daemonActions.length || versions.length;
  if (buttonsAnywhere) out.push(leaderNotice());

  const facts = [];
  if (info && info.version !== undefined) facts.push(["version", h("span", {id: "role-version"}, String(info.version))]);
  if (info && info.info) facts.push(["info", String(info.info)]);
  if (info && Array.isArray(info.shortinfo)) {
    for (const item of info.shortinfo) {
      if (Array.isArray(item) && item.length >= 3) {
        facts.push([String(item[1]), item[0] === "gauge" && item.length >= 4 ? item[2] + " / " + item[3] : String(item[2])]);
      }
    }
  }
  facts.push(["nodes", String(nodesOf(sched, role).length)]);
  out.push(card(null, kv(facts),
    globalActions.length ? h("div", {class: "toolbar", style: "margin-top:10px", id: "global-actions"},
      globalActions.map((a) => actionButton(String(a.title || a.id), {button: {action: a.id, data: a.data, role}}, a.confirm, results))) : null,
    results));

  if (versions.length) out.push(versionCard(role, info, frontend, versions, results));

  // Per node: the node's part of the role's variables, daemons and their buttons.
  const nodes = nodesOf(sched, role);
  const daemonRows = [];
  for (const [host, entry] of nodes) {
    const daemons = (entry && typeof entry.daemons === "object" && entry.daemons) || {};
    for (const [name, daemon] of Object.entries(daemons)) {
      daemonRows.push(h("tr", {},
        h("td", {}, nodeLink(host)), h("td", {}, name),
        h("td", {class: "mono"}, daemon && daemon.image !== undefined ? String(daemon.image) : ""),
        h("td", {class: "num"}, daemon && daemon.instances !== undefined ? String(daemon.instances) : ""),
        h("td", {}, daemonActions.map((a) => actionButton(String(a.title || a.id),
          {button: {action: a.id, host, daemon: name, data: a.data, role}}, a.confirm, results)))));
    }
  }
  if (daemonRows.length) out.push(card("Processes", table(["Node", "Process", "Image", "Instances", ""], daemonRows)));
  out.push(card("Variables by node",
    info !== undefined ? h("details", {}, h("summary", {}, "Role-wide (", h("code", {}, "roles." + role), ")"),
      h("pre", {}, json(info))) : null,
    nodes.length ? table(["Node", "Node's variables (nodes.<node>.roles." + role + ")"], nodes.map(([host, entry]) =>
      h("tr", {}, h("td", {}, nodeLink(host)), h("td", {}, h("pre", {}, json(entry)))))) :
      h("p", {class: "muted"}, "No node has this role.")));

  // This node: what it renders, whether it fails, and its deployments.
  const rd = data.rolesData;
  const failure = rd && rd.failed && rd.failed[role];
  if (failure) {
    out.push(h("div", {class: "banner bad", id: "role-failure"},
      h("strong", {}, "Failing on this node"), " since ", when(failure.since), ", ", failure.attempts, " attempt(s): ",
      h("pre", {}, failure.message), link(roleLogPath(role, deployments, failure.deployment_id), "Log of the last attempt")));
  }
  if (rd && rd.to_render && role in rd.to_render) {
    out.push(card("Rendered here with", h("details", {}, h("summary", {}, "Variables on " + s.hostname),
      h("pre", {}, json(rd.to_render[role])))));
  }
  out.push(card("Deployments on this node", deploymentsOf(role, deployments)));
  return out;
}

function versionCard(role, info, frontend, versions, results) {
  const buttons = Array.isArray(frontend.version_buttons) && frontend.version_buttons.length
    ? frontend.version_buttons
    : [{title: "Switch To", action: "quick_switch", confirm: true}];
  const state = versionCard.showAll = versionCard.showAll || {};
  const shown = state[role] ? versions : versions.slice(0, 20);
  const rows = shown.map((v) => h("tr", {},
    h("td", {class: "mono"}, String(v)),
    h("td", {}, v === info.version ? pill("current", "ok") : null, v === info.pinned ? pill("pinned", "warn") : null),
    h("td", {}, buttons.map((b) => actionButton(String(b.title || b.action),
      {button: {action: b.action, data: b.data, version: v, role}},
      b.confirm === true ? "Switch " + role + " to " + v + "?" : b.confirm, results)))));
  const more = versions.length > shown.length ? h("button", {type: "button", onclick: () => {
    state[role] = true;
    rerender();
  }}, "Show all " + versions.length) : null;
  return card("Versions", table(["Version", "", ""], rows, {id: "versions"}), more);
}

function nodeLink(hostname) {
  const node = nodeByHostname(hostname);
  if (!node || node.self || !node.addr) return h("span", {}, hostname);
  return h("a", {href: "http://" + node.addr + "/", title: node.name}, hostname);
}

/** Log pages of `role` from the index entries: one row per attempt. */
function deploymentsOf(role, entries) {
  const s = data.status;
  if (s && !nodesOf(data.schedule, role).some(([n]) => n === s.hostname)) {
    return h("p", {class: "muted"}, "The schedule does not give this role to this node.");
  }
  if (entries === null) return h("p", {class: "muted"}, "Loading the log index…");
  if (entries instanceof Error) return h("p", {class: "muted"}, "No deployment log: " + entries.message);
  const rows = entries.filter((e) => e.role === role && e.marker === "RoleStart").slice(0, 50);
  if (!rows.length) return h("p", {class: "muted"}, "No deployment of this role in the recent log.");
  const failed = data.rolesData && data.rolesData.failed && data.rolesData.failed[role];
  return table(["Time", "Deployment", ""], rows.map((e) => h("tr", {},
    h("td", {}, when(e.ms)),
    h("td", {class: "mono"}, e.deployment, failed && failed.deployment_id === e.deployment ? [" ", pill("failed", "bad")] : null),
    h("td", {}, link(tailPath(e), "log")))), {id: "role-deployments"});
}

function roleLogPath(role, entries, deployment) {
  if (Array.isArray(entries)) {
    const hit = entries.find((e) => e.role === role && e.marker === "RoleStart" && e.deployment === deployment);
    if (hit) return tailPath(hit);
  }
  return "/tail/role/" + encodeURIComponent(role) + "/latest";
}

// Nodes ----------------------------------------------------------------------------------------

function nodesPage() {
  const root = h("div", {});
  let timer = null;
  function draw() {
    const s = data.status;
    if (!s) return;
    const d = (data.schedule && data.schedule.data) || {};
    const nodes = d.nodes || {};
    const self = {id: s.id, hostname: s.hostname, name: s.name, primary_addr: null, self: true,
      known_since: null, last_report_direct: null, errors: s.num_errors,
      schedule: s.schedule_id ? {hash: s.schedule_id} : null};
    const all = [self, ...data.peers];
    const rows = all.map((p) => {
      const entry = nodes[p.hostname] || {};
      const roles = Object.keys(entry.roles || {}).sort();
      const info = Array.isArray(entry.shortinfo) ? entry.shortinfo.filter(Array.isArray)
        .map((i) => i[1] + ": " + (i[0] === "gauge" && i.length >= 4 ? i[2] + "/" + i[3] : i[2])).join(", ") : "";
      const leaderMark = s.leader && s.leader.id === p.id ? [" ", pill("leader")] : null;
      return h("tr", {},
        h("td", {}, p.self ? h("strong", {}, p.hostname) : p.primary_addr
          ? h("a", {href: "http://" + p.primary_addr + "/"}, p.hostname) : p.hostname, leaderMark,
        p.self ? [" ", pill("this node")] : null),
        h("td", {}, p.name),
        h("td", {class: "mono"}, p.primary_addr || (p.self ? location.host : "—")),
        h("td", {}, roles.map((r) => [link("/roles/" + encodeURIComponent(r), r), " "]), info ? h("div", {class: "muted"}, info) : null),
        h("td", {}, !p.self && !isLeader() ? h("span", {class: "muted"}, "—")
          : p.errors ? pill(p.errors + " error(s)", "bad") : pill("ok", "ok")),
        h("td", {class: "mono", title: (p.schedule && p.schedule.hash) || ""}, p.schedule ? short(p.schedule.hash) : "—"),
        h("td", {}, p.self ? "—" : when(p.last_report_direct)),
        h("td", {}, p.self ? "—" : when(p.known_since)),
        h("td", {class: "mono muted", title: p.id}, short(p.id)));
    });
    const extra = Object.keys(nodes).filter((n) => !all.some((p) => p.hostname === n)).sort();
    fill(root, h("h1", {}, "Nodes"),
      card(null, table(["Host", "Name", "Address", "Roles", "Errors", "Schedule", "Last report", "Known since", "Id"], rows, {id: "nodes"}),
        isLeader() ? null : h("p", {class: "muted"}, "Errors of other nodes reach the leader only.")),
      extra.length ? card("In the schedule, not in the peer list", h("p", {}, extra.join(", "))) : null);
  }
  draw();
  // The peer list's report times move without a status change: refresh while the page is open.
  timer = setInterval(() => getJson("/v1/peers").then((p) => { data.peers = p; draw(); }, () => {}), 5000);
  return {node: root, live: draw, leave: () => clearInterval(timer)};
}

// Schedule -------------------------------------------------------------------------------------

const openPaths = new Set(["$"]);

function schedulePage() {
  const root = h("div", {});
  let drawnFor;
  function draw() {
    const sched = data.schedule;
    if (sched && drawnFor === sched.hash) return;
    drawnFor = sched && sched.hash;
    if (!sched) {
      fill(root, h("h1", {}, "Schedule"), card(null, h("p", {class: "muted"}, "No schedule yet.")));
      return;
    }
    const tree = h("div", {class: "tree-root", id: "schedule-tree"}, treeNode("data", sched.data, "$"));
    fill(root, h("h1", {}, "Schedule"),
      card(null, kv([["hash", h("span", {class: "mono"}, sched.hash)], ["made", when(sched.timestamp)],
        ["by", originName(sched.origin)]]),
      h("div", {class: "toolbar", style: "margin-top:10px"},
        h("button", {type: "button", onclick: () => setAll(tree, true)}, "Expand all"),
        h("button", {type: "button", onclick: () => setAll(tree, false)}, "Collapse all"),
        h("a", {href: "/v1/schedule.pretty"}, "raw JSON"))),
      card(null, tree));
  }
  draw();
  return {node: root, live: draw};
}

/** A collapsible node of the tree; children are built when first opened. */
function treeNode(key, value, path) {
  const label = h("span", {class: "key"}, key);
  if (value === null || typeof value !== "object") {
    return h("div", {class: "leaf"}, label, ": ", scalar(value));
  }
  const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v]) : Object.entries(value);
  const summary = h("summary", {}, label, h("span", {class: "muted"},
    Array.isArray(value) ? " [" + entries.length + "]" : " {" + entries.length + "}"));
  const details = h("details", {class: "tree", "data-path": path}, summary);
  let built = false;
  const build = () => {
    if (built) return;
    built = true;
    details.append(...entries.map(([k, v]) => treeNode(k, v, path + "/" + k)));
  };
  details.addEventListener("toggle", () => {
    if (details.open) { openPaths.add(path); build(); } else openPaths.delete(path);
  });
  if (openPaths.has(path)) { details.open = true; build(); }
  return details;
}

function scalar(value) {
  if (typeof value === "string") return h("span", {class: "str"}, JSON.stringify(value));
  if (typeof value === "number") return h("span", {class: "numv"}, String(value));
  return h("span", {class: "lit"}, String(value));
}

function setAll(tree, open) {
  // Opening builds children, which may hold more closed nodes: repeat until none is left.
  for (let round = 0; round < 64; round++) {
    const pending = [...tree.querySelectorAll("details.tree")].filter((d) => d.open !== open);
    if (!pending.length) return;
    for (const d of pending) {
      d.open = open;
      d.dispatchEvent(new Event("toggle"));
    }
  }
}

// Scheduler log --------------------------------------------------------------------------------

function schedulerPage() {
  const root = h("div", {});
  let drawnFor;
  async function draw() {
    const s = data.status;
    if (!s) return;
    const key = [s.schedule_id, s.metrics.scheduler_succeeded, s.metrics.scheduler_failed, isLeader()].join("|");
    if (key === drawnFor) return;
    drawnFor = key;
    const head = h("h1", {}, "Scheduler log");
    const runs = s.metrics.scheduler_succeeded + s.metrics.scheduler_failed;
    if (!runs) {
      const url = leaderUrl("/scheduler");
      fill(root, head, card(null, h("p", {}, "The scheduler has not run on this node: only the leader runs it. ",
        url ? h("a", {href: url}, "Open it on the leader (" + s.leader.name + ")") : null)));
      return;
    }
    let text;
    try {
      const response = await fetch("/v1/scheduler_debug_info");
      text = response.ok ? await response.text() : "(" + response.status + ")";
    } catch (e) {
      text = "(cannot load: " + e.message + ")";
    }
    const error = s.errors.scheduler || s.errors.scheduler_load;
    fill(root, head,
      error ? h("div", {class: "banner bad"}, h("strong", {}, "The last run failed: "), h("pre", {}, error)) : null,
      card(null, kv([["runs", s.metrics.scheduler_succeeded + " ok, " + s.metrics.scheduler_failed + " failed"]]),
        h("p", {}, h("a", {href: "/v1/scheduler_input.pretty"}, "input of the last run"), " · ",
          h("a", {href: "/v1/scheduler_debug_info"}, "raw"))),
      h("pre", {class: "log", id: "scheduler-log"}, text));
  }
  draw();
  return {node: root, live: draw};
}

// Logs -----------------------------------------------------------------------------------------

/** The newest log index lines (the last MiB of the index, as 0.13 read it), newest first. */
async function loadIndex() {
  const response = await fetch("/v1/log/index/latest", {headers: {Range: "bytes=-1048576"}});
  if (!response.ok) throw new Error(response.status + " " + response.statusText);
  let text = await response.text();
  // A range that starts mid-file starts mid-line: drop the partial line.
  const range = response.headers.get("Content-Range");
  if (response.status === 206 && range && !/^bytes 0-/.test(range)) text = text.slice(text.indexOf("\n") + 1);
  const entries = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    try {
      const [time, deployment, pointer, marker] = JSON.parse(line);
      const fields = (pointer && pointer.fields) || [];
      const entry = {time, ms: Date.parse(time), deployment, kind: pointer && pointer.variant, fields,
        marker: typeof marker === "string" ? marker : marker && marker.variant,
        detail: marker && marker.fields ? marker.fields.join(" ") : "",
        role: pointer && pointer.variant === "Role" ? fields[0] : null};
      entries.push(entry);
    } catch (e) {
      // A line being written right now, or not an index line: skip it.
    }
  }
  return entries.reverse();
}

/** The tail page of an index entry's file, at its offset. */
function tailPath(e) {
  const f = e.fields;
  switch (e.kind) {
    case "Role": return "/tail/role/" + encodeURIComponent(f[0]) + "/log." + f[1] + ".txt?offset=" + f[2];
    case "Global": return "/tail/global/log." + f[0] + ".txt?offset=" + f[1];
    case "Changes": return "/tail/changes/log." + f[0] + ".txt?offset=" + f[1];
    case "External": return "/tail/external/" + f[0].split("/").map(encodeURIComponent).join("/");
    default: return "/logs";
  }
}

function logsPage() {
  const root = h("div", {});
  const params = new URLSearchParams(location.search);
  let filter = params.get("filter") || "";
  const select = h("select", {id: "log-filter"});
  const body = h("div", {});
  const refresh = h("button", {type: "button"}, "Refresh");
  let entries = null;
  root.append(h("h1", {}, "Deployment log"),
    h("div", {class: "toolbar"}, "Show ", select, refresh,
      h("a", {href: "/v1/log/index/latest"}, "raw index"), h("a", {href: BASE + "/tail/global/latest", "data-link": true}, "global log"),
      h("a", {href: BASE + "/tail/changes/latest", "data-link": true}, "changes log")),
    body);
  select.addEventListener("change", () => {
    filter = select.value;
    history.replaceState(null, "", BASE + "/logs" + (filter ? "?filter=" + encodeURIComponent(filter) : ""));
    draw();
  });
  function draw() {
    const roles = new Set(Array.isArray(entries) ? entries.filter((e) => e.role).map((e) => e.role) : []);
    if (filter && filter !== "-") roles.add(filter);
    fill(select, h("option", {value: ""}, "everything"), h("option", {value: "-"}, "deployments only (no role)"),
      [...roles].sort().map((r) => h("option", {value: r}, "role " + r)));
    select.value = filter;
    if (entries === null) { fill(body, card(null, h("p", {class: "muted"}, "Loading…"))); return; }
    if (entries instanceof Error) { fill(body, card(null, h("p", {class: "muted"}, "No deployment log: " + entries.message))); return; }
    const shown = entries.filter((e) => !filter || (filter === "-" ? !e.role : e.role === filter)).slice(0, 200);
    const failing = new Set((data.status && data.status.failed_roles) || []);
    fill(body, card(null, shown.length ? table(["Time", "Deployment", "Where", "Event", ""], shown.map((e) =>
      h("tr", {},
        h("td", {}, when(e.ms)),
        h("td", {class: "mono"}, e.deployment),
        h("td", {}, e.role ? [link("/roles/" + encodeURIComponent(e.role), e.role), failing.has(e.role) ? [" ", pill("failing", "bad")] : null]
          : h("span", {class: "muted"}, (e.kind || "").toLowerCase())),
        h("td", {}, e.marker, e.detail ? h("span", {class: "muted"}, " " + e.detail) : null),
        h("td", {}, link(tailPath(e), "view")))), {id: "log-rows"})
      : h("p", {class: "muted"}, "Nothing logged for this filter.")));
  }
  async function load() {
    try { entries = await loadIndex(); } catch (e) { entries = e; }
    draw();
  }
  refresh.addEventListener("click", load);
  draw();
  // New deployments follow schedule changes and re-renders: re-read the index on those.
  return {node: root, live: (prev) => {
    const s = data.status;
    if (!prev || deploymentKey(prev) !== deploymentKey(s) || prev.schedule_id !== s.schedule_id) load();
  }};
}

// Tail -----------------------------------------------------------------------------------------

const CHUNK = 16384;

function tailPage(rest) {
  const params = new URLSearchParams(location.search);
  const file = rest;                      // e.g. role/web/log.20261122054306.txt, global/latest
  const api = "/v1/log/" + file;
  const pre = h("pre", {class: "log", id: "tail"});
  const note = h("span", {class: "muted"});
  const follow = h("input", {type: "checkbox", id: "follow"});
  let start = null;   // first byte shown
  let end = 0;        // one past the last byte shown
  let timer = null;
  const root = h("div", {},
    h("h1", {}, "Log ", h("code", {}, file)),
    h("div", {class: "toolbar"},
      h("button", {type: "button", onclick: () => previous()}, "Load previous"),
      h("button", {type: "button", onclick: () => more()}, "Load more"),
      h("button", {type: "button", onclick: () => skipToEnd()}, "Skip to end"),
      h("label", {}, follow, " follow"),
      h("a", {href: api}, "raw"), note),
    pre);

  async function size() {
    // HEAD: a range past the end would be a 416 (and an error in the console) when nothing grew.
    const response = await fetch(api, {method: "HEAD", cache: "no-store"});
    if (!response.ok) throw new Error(response.status === 404 ? "no such log" : String(response.status));
    return Number(response.headers.get("Content-Length") || 0);
  }
  async function read(from, to) {
    if (to <= from) return "";
    const response = await fetch(api, {headers: {Range: "bytes=" + from + "-" + (to - 1)}, cache: "no-store"});
    if (!response.ok) throw new Error(String(response.status));
    return await response.text();
  }
  function show(text, atEnd) {
    const lines = text.split("\n").map((l) => {
      if (/ -{12} .* -{11}/.test(l)) return h("span", {class: "marker"}, l + "\n");
      if (/^result: (error|failed)/.test(l)) return h("span", {class: "failed"}, l + "\n");
      return l + "\n";
    });
    if (lines.length && text.endsWith("\n")) lines.pop();
    if (atEnd) pre.append(...lines); else pre.prepend(...lines);
  }
  async function open() {
    try {
      const total = await size();
      const offset = params.has("offset") ? Math.min(Number(params.get("offset")) || 0, total) : Math.max(0, total - CHUNK);
      start = offset;
      end = Math.min(total, offset + CHUNK);
      fill(pre);
      show(await read(start, end), true);
      note.textContent = status(total);
      if (!params.has("offset")) { follow.checked = true; following(); }
    } catch (e) {
      pre.textContent = "Cannot read " + file + ": " + e.message;
    }
  }
  function status(total) {
    return "bytes " + start + "–" + end + " of " + total;
  }
  async function more() {
    try {
      const total = await size();
      const to = Math.min(total, end + CHUNK);
      show(await read(end, to), true);
      end = to;
      note.textContent = status(total);
    } catch (e) { note.textContent = e.message; }
  }
  async function previous() {
    if (!start) return;
    const from = Math.max(0, start - CHUNK);
    try {
      show(await read(from, start), false);
      start = from;
    } catch (e) { note.textContent = e.message; }
  }
  async function skipToEnd() {
    params.delete("offset");
    await open();
    pre.scrollTop = pre.scrollHeight;
  }
  async function poll() {
    try {
      const total = await size();
      if (total < end) { await open(); return; }   // the file was replaced
      if (total > end) {
        const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        show(await read(end, total), true);
        end = total;
        note.textContent = status(total);
        if (stick) pre.scrollTop = pre.scrollHeight;
      }
    } catch (e) { note.textContent = e.message; }
  }
  function following() {
    clearInterval(timer);
    timer = follow.checked ? setInterval(poll, 1000) : null;
  }
  follow.addEventListener("change", following);
  open();
  return {node: root, leave: () => clearInterval(timer)};
}

// Backups and API links ------------------------------------------------------------------------

function backupsPage() {
  const root = h("div", {}, h("h1", {}, "Schedule backups"), card(null, h("p", {class: "muted"}, "Loading…")));
  getJson("/v1/backups").then((names) => {
    fill(root, h("h1", {}, "Schedule backups"), card(null,
      names.length ? table(["Backup", "Kind"], names.slice().reverse().map((n) => h("tr", {},
        h("td", {}, h("a", {href: "/v1/backup/" + encodeURIComponent(n)}, n)),
        h("td", {class: "muted"}, n.split("-")[0]))), {id: "backups"})
        : h("p", {class: "muted"}, "No backups yet: one is made with each new schedule, per hour, day and week."),
      h("p", {class: "muted"}, "Each is the gzipped schedule.json of its period; browsers show it unpacked.")));
  }, (e) => {
    fill(root, h("h1", {}, "Schedule backups"), card(null, h("p", {}, "Cannot list backups: " + e.message)));
  });
  return {node: root};
}

function apiPage() {
  const names = ["status", "peers", "schedule", "scheduler_input", "election", "pending_actions", "roles_data", "backups"];
  return {node: h("div", {}, h("h1", {}, "API"), card(null,
    table(["Route", "Formats"], names.map((n) => h("tr", {},
      h("td", {class: "mono"}, "/v1/" + n),
      h("td", {}, h("a", {href: "/v1/" + n}, "json"), " · ", h("a", {href: "/v1/" + n + ".pretty"}, "pretty")))).concat([
      h("tr", {}, h("td", {class: "mono"}, "/v1/scheduler_debug_info"), h("td", {}, h("a", {href: "/v1/scheduler_debug_info"}, "text"))),
      h("tr", {}, h("td", {class: "mono"}, "/v1/events"), h("td", {}, h("a", {href: "/v1/events"}, "event stream"))),
      h("tr", {}, h("td", {class: "mono"}, "/metrics"), h("td", {}, h("a", {href: "/metrics"}, "Prometheus"))),
    ])),
    h("p", {class: "muted"}, "Every route is described in docs/openapi.yaml and docs/http-api.md.")))};
}

// ---------------------------------------------------------------------------------------------
// Routing

let current = null;

function route() {
  let path = location.pathname.slice(BASE.length);
  try { path = decodeURIComponent(path); } catch (e) { /* a bad escape typed by hand: use it as it is */ }
  path = path.replace(/\/+$/, "") || "/";
  const parts = path.split("/").filter(Boolean);
  if (current && current.leave) current.leave();
  switch (parts[0]) {
    case undefined: return overviewPage();
    case "roles": return rolesPage(parts[1] || null);
    case "nodes": case "peers": return nodesPage();
    case "schedule": return schedulePage();
    case "scheduler": return schedulerPage();
    case "logs": return logsPage();
    case "tail": return tailPage(location.pathname.slice(BASE.length + "/tail/".length));
    case "backups": return backupsPage();
    case "api": return apiPage();
    default: return {node: card(null, h("p", {}, "No page ", h("code", {}, path), ". ", link("/", "Overview")))};
  }
}

function rerender() {
  current = route();
  fill(document.getElementById("page"), current.node);
  // A page opened after the first status: it sees the status as new (live(null)).
  if (data.status && current.live) current.live(null);
  const section = "/" + (location.pathname.slice(BASE.length).split("/")[1] || "");
  for (const a of document.querySelectorAll("#nav a")) {
    const target = a.getAttribute("href");
    a.classList.toggle("active", target === BASE + section || (section === "/tail" && target === BASE + "/logs"));
  }
}

document.addEventListener("click", (e) => {
  const a = e.target.closest && e.target.closest("a[data-link]");
  if (!a || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
  e.preventDefault();
  const href = a.getAttribute("href");
  history.pushState(null, "", href.startsWith(BASE) ? href : BASE + href);
  rerender();
  window.scrollTo(0, 0);
});
window.addEventListener("popstate", rerender);

// Ages ("12 s ago") move on without a status change.
setInterval(() => {
  for (const t of document.querySelectorAll("time[data-ago]")) t.textContent = ago(Number(t.dataset.ago));
}, 1000);

// Header links are written without BASE; fix them once when served under /~common/.
if (BASE) for (const a of document.querySelectorAll("a[data-link]")) a.setAttribute("href", BASE + a.getAttribute("href"));

rerender();
connect();
