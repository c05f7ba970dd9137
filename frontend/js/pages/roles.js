// The Roles page (`/roles`) and a role's page (`/roles/<role>`): facts, versions, processes and
// their buttons, variables, the failure on this node and its deployments.

import {actionButton, forceRenderButton, leaderNotice} from "../actions.js";
import {card, failed, fill, h, json, kv, link, pill, table, when} from "../dom.js";
import {loadIndex, tailPath, textsAfter} from "../logindex.js";
import {nodeLink} from "../parts.js";
import {allRoles, deploymentKey, nodesOf, roleIsHere} from "../state.js";

/** Versions shown before `Show all`. */
const VERSIONS_SHOWN = 20;
/** Deployments of a role listed on its page. */
const DEPLOYMENTS_SHOWN = 50;

export function rolesPage(ctx, role) {
  const {state, api, notices} = ctx;
  const root = h("div", {class: "split"});
  const side = h("div", {class: "side"});
  const list = h("div", {id: "role-list"});
  const filter = h("input", {type: "search", placeholder: "Filter roles", value: state.ui.roleFilter});
  filter.addEventListener("input", () => { state.ui.roleFilter = filter.value; drawList(); });
  const results = h("div", {class: "results"});
  side.append(filter, list, h("div", {style: "margin-top:12px"}, forceRenderButton(ctx, results)), results);
  const content = h("div", {id: "role"});
  root.append(side, content);
  // Kept across redraws: a press changes the schedule, which redraws the page.
  const actionResults = h("div", {class: "results", id: "action-results"});
  // The log index: null while loading, {entries, unreadable}, or the error that kept it away.
  let deployments = null;

  function drawList() {
    const failing = new Set((state.status && state.status.failed_roles) || []);
    const held = (state.status && state.status.blocked_roles) || {};
    const needle = state.ui.roleFilter.toLowerCase();
    fill(list, ...allRoles(state.schedule).filter((r) => r.toLowerCase().includes(needle)).map((r) => {
      const mark = failing.has(r) ? pill("failing", "bad")
        : held[r] ? pill(held[r].state, held[r].state === "blocked" ? "bad" : "warn") : null;
      const a = link("/roles/" + encodeURIComponent(r), r, mark);
      if (r === role) a.classList.add("active");
      return a;
    }));
  }

  function draw() {
    drawList();
    if (!role) {
      fill(content, card(null, h("p", {class: "muted"},
        allRoles(state.schedule).length ? "Pick a role."
          : state.status ? "The schedule has no roles yet." : "Loading the schedule…")));
      return;
    }
    fill(content, ...rolePage(ctx, role, deployments, actionResults, draw));
  }

  // Deployments of the role on this node: only where the schedule gives it this node (a node
  // that never rendered anything has no log index, and asking for it would show a failure).
  let requested = false;
  async function reload() {
    requested = true;
    try {
      deployments = await loadIndex(api);
    } catch (e) {
      deployments = e;
      notices.show(e);
    }
    draw();
    if (deployments instanceof Error) return;
    // Each attempt's result is the line after its RoleFinish in the role's log.
    const index = deployments;
    try {
      index.results = await textsAfter(api, index.entries.filter((e) => e.role === role && e.marker === "RoleFinish")
        .slice(0, DEPLOYMENTS_SHOWN));
    } catch (e) {
      index.results = e;
      notices.show(e);
    }
    if (deployments === index) draw();
  }
  draw();
  return {node: root, live: (prev) => {
    // Redraw on what the role page shows; keep open buttons' results otherwise.
    const s = state.status;
    if (role && roleIsHere(state, role) && (!requested || (prev && deploymentKey(prev) !== deploymentKey(s)))) reload();
    if (!prev || prev.schedule_id !== s.schedule_id || prev.failed_roles.join() !== s.failed_roles.join()
        || JSON.stringify(prev.blocked_roles) !== JSON.stringify(s.blocked_roles)
        || prev.election_state.is_leader !== s.election_state.is_leader || deploymentKey(prev) !== deploymentKey(s)) {
      draw();
    }
  }};
}

function rolePage(ctx, role, deployments, results, redraw) {
  const {state} = ctx;
  const s = state.status;
  const sched = state.schedule;
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
  if (buttonsAnywhere) out.push(leaderNotice(state));

  const facts = [];
  if (info && info.version !== undefined) facts.push(["Version", h("span", {id: "role-version"}, String(info.version))]);
  if (info && info.info) facts.push(["Info", String(info.info)]);
  if (info && Array.isArray(info.shortinfo)) {
    for (const item of info.shortinfo) {
      if (Array.isArray(item) && item.length >= 3) {
        facts.push([String(item[1]), item[0] === "gauge" && item.length >= 4 ? item[2] + " / " + item[3] : String(item[2])]);
      }
    }
  }
  facts.push(["Nodes", String(nodesOf(sched, role).length)]);
  out.push(card(null, kv(facts),
    globalActions.length ? h("div", {class: "toolbar", style: "margin-top:10px", id: "global-actions"},
      globalActions.map((a) => actionButton(ctx, String(a.title || a.id), {button: {action: a.id, data: a.data, role}},
        a.confirm, results))) : null,
    results));

  if (versions.length) out.push(versionCard(ctx, role, info, frontend, versions, results, redraw));

  // Per node: the node's part of the role's variables, daemons and their buttons.
  const nodes = nodesOf(sched, role);
  const daemonRows = [];
  for (const [host, entry] of nodes) {
    const daemons = (entry && typeof entry.daemons === "object" && entry.daemons) || {};
    for (const [name, daemon] of Object.entries(daemons)) {
      daemonRows.push(h("tr", {},
        h("td", {}, nodeLink(state, host)), h("td", {}, name),
        h("td", {class: "mono"}, daemon && daemon.image !== undefined ? String(daemon.image) : ""),
        h("td", {class: "num"}, daemon && daemon.instances !== undefined ? String(daemon.instances) : ""),
        h("td", {}, daemonActions.map((a) => actionButton(ctx, String(a.title || a.id),
          {button: {action: a.id, host, daemon: name, data: a.data, role}}, a.confirm, results)))));
    }
  }
  if (daemonRows.length) out.push(card("Processes", table(["Node", "Process", "Image", "Instances", ""], daemonRows)));
  out.push(card("Variables by node",
    info !== undefined ? h("details", {}, h("summary", {}, "Role-wide (", h("code", {}, "roles." + role), ")"),
      h("pre", {}, json(info))) : null,
    nodes.length ? table(["Node", "Node's variables (nodes.<node>.roles." + role + ")"], nodes.map(([host, entry]) =>
      h("tr", {}, h("td", {}, nodeLink(state, host)), h("td", {}, h("pre", {}, json(entry)))))) :
      h("p", {class: "muted"}, "No node has this role.")));

  // This node: what it renders, whether it fails, and its deployments.
  const rd = state.rolesData;
  const failure = rd && rd.failed && rd.failed[role];
  if (failure) {
    out.push(h("div", {class: "banner bad", id: "role-failure"},
      h("strong", {}, "Failing on this node"), " since ", when(failure.since), ", ", failure.attempts, " attempt(s): ",
      h("pre", {}, failure.message), link(roleLogPath(role, deployments, failure.deployment_id), "Log of the last attempt")));
  }
  const held = s && s.blocked_roles && s.blocked_roles[role];
  if (held) {
    const blocked = held.state === "blocked";
    const roots = held.root_cause || [];
    // The root cause when it is not the direct dependency itself: the role that failed
    // (blocked), or the one the chain waits for (waiting).
    const deeper = roots.join() !== held.on.join();
    out.push(h("div", {class: "banner " + (blocked ? "bad" : "warn"), id: "role-held"},
      h("strong", {}, blocked ? "Blocked on this node" : "Waiting on this node"),
      " since ", when(held.since), ": ", held.reason, " (depends_on: ", roleNames(held.on), ")",
      blocked ? [". Root cause: ", h("span", {id: "role-root-cause"}, roleNames(roots)), " failed."]
        : deeper ? [". At the end of the chain: ", h("span", {id: "role-root-cause"}, roleNames(roots)),
          ", not applied yet."] : null));
  }
  if (rd && rd.to_render && role in rd.to_render) {
    out.push(card("Rendered here with", h("details", {}, h("summary", {}, "Variables on " + s.hostname),
      h("pre", {}, json(rd.to_render[role])))));
  }
  out.push(card("Deployments on this node", deploymentsOf(state, role, deployments)));
  return out;
}

/** Links to roles, comma-separated, in a span whose links have no margin of their own. */
function roleNames(roles) {
  return h("span", {class: "names"},
    roles.flatMap((r, i) => [i ? ", " : "", link("/roles/" + encodeURIComponent(r), r)]));
}

function versionCard(ctx, role, info, frontend, versions, results, redraw) {
  const all = ctx.state.ui.allVersions;
  const buttons = Array.isArray(frontend.version_buttons) && frontend.version_buttons.length
    ? frontend.version_buttons
    : [{title: "Switch To", action: "quick_switch", confirm: true}];
  const shown = all.has(role) ? versions : versions.slice(0, VERSIONS_SHOWN);
  const rows = shown.map((v) => h("tr", {},
    h("td", {class: "mono"}, String(v)),
    h("td", {}, v === info.version ? pill("current", "ok") : null, v === info.pinned ? pill("pinned", "warn") : null),
    h("td", {}, buttons.map((b) => actionButton(ctx, String(b.title || b.action),
      {button: {action: b.action, data: b.data, version: v, role}},
      b.confirm === true ? "Switch " + role + " to " + v + "?" : b.confirm, results)))));
  const more = versions.length > shown.length ? h("button", {type: "button", onclick: () => {
    all.add(role);
    redraw();
  }}, "Show all " + versions.length) : null;
  // A fixed layout: the button column stays put whatever the versions' and marks' widths.
  return card("Versions", table(["Version", "State", buttons.length === 1 ? "Action" : "Actions"], rows,
    {id: "versions", class: "fixed versions"}), more);
}

/** Log pages of `role` from the index: one row per attempt. */
function deploymentsOf(state, role, index) {
  if (state.status && !roleIsHere(state, role)) {
    return h("p", {class: "muted"}, "The schedule does not give this role to this node.");
  }
  if (index === null) return h("p", {class: "muted"}, "Loading the log index…");
  if (index instanceof Error) return failed("No deployment log", index);
  const rows = index.entries.filter((e) => e.role === role && e.marker === "RoleStart").slice(0, DEPLOYMENTS_SHOWN);
  if (!rows.length) return h("p", {class: "muted"}, "No deployment of this role in the recent log.");
  const failedHere = state.rolesData && state.rolesData.failed && state.rolesData.failed[role];
  return table(["Time", "Deployment", "Result", ""], rows.map((e) => h("tr", {},
    h("td", {}, when(e.ms)),
    h("td", {class: "mono"}, e.deployment,
      failedHere && failedHere.deployment_id === e.deployment ? [" ", pill("last failure", "bad")] : null),
    h("td", {class: "result"}, attemptResult(state, role, index, e)),
    h("td", {}, link(tailPath(e), "log")))), {id: "role-deployments"});
}

/** `ok` or `failed` (the error in the tooltip) from the line after the attempt's RoleFinish. */
function attemptResult(state, role, index, start) {
  const finish = index.entries.find((e) => e.role === role && e.marker === "RoleFinish" && e.deployment === start.deployment);
  if (!finish) {
    const last = state.status && state.status.last_deployment;
    return last && last.id === start.deployment && !last.finished ? pill("running", "warn")
      : h("span", {class: "muted", title: "No RoleFinish in the index"}, "unfinished");
  }
  if (!index.results) return h("span", {class: "muted"}, "…");
  if (index.results instanceof Error) return h("span", {class: "muted", title: index.results.message}, "?");
  const text = index.results.get(finish);
  if (text === undefined) return h("span", {class: "muted", title: "Before the last MiB of the log"}, "?");
  if (/^result: ok\b/.test(text)) return pill("ok", "ok");
  const error = /^result: error: ?([^]*)/.exec(text);
  return error ? h("span", {title: error[1]}, pill("failed", "bad")) : h("span", {class: "muted", title: text}, "?");
}

function roleLogPath(role, index, deployment) {
  if (index && Array.isArray(index.entries)) {
    const hit = index.entries.find((e) => e.role === role && e.marker === "RoleStart" && e.deployment === deployment);
    if (hit) return tailPath(hit);
  }
  return "/tail/role/" + encodeURIComponent(role) + "/latest";
}
