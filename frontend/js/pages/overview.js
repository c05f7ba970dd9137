// The Overview page (`/`): leader, schedule, this node, peers, errors, roles, changes.

import {forceRenderButton} from "../actions.js";
import {card, fill, h, kv, link, pill, short, table, when} from "../dom.js";
import {originName} from "../parts.js";
import {allRoles, isLeader, nodesOf} from "../state.js";

export function overviewPage(ctx) {
  const {state} = ctx;
  const root = h("div", {id: "overview"});
  const results = h("div", {class: "results"});
  const rerender = forceRenderButton(ctx, results);
  function draw() {
    const s = state.status;
    if (!s) return;
    const sched = state.schedule;
    const d = (sched && sched.data) || {};
    const leader = s.leader;
    const roles = allRoles(sched);
    const failing = new Set(s.failed_roles);
    const held = s.blocked_roles || {};
    fill(root,
      h("div", {class: "grid"},
        card("Leader",
          h("div", {class: "big", id: "leader"}, leader ? leader.name : "No leader"),
          leader ? kv([["host", leader.hostname], ["address", leader.addr || "unknown"],
            ["this node", isLeader(state) ? "is the leader" : "follows it"]])
            : h("p", {class: "muted"}, "An election is going on (", link("/nodes", "nodes"), ").")),
        card("Schedule",
          h("div", {class: "big mono", id: "schedule-hash", title: s.schedule_id || ""}, short(s.schedule_id)),
          kv([["made", sched ? when(sched.timestamp) : "—"],
            ["status", pill(s.schedule_status, s.schedule_status === "ok" ? "ok" : "warn")],
            ["by", sched ? originName(state, sched.origin) : "—"]])),
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
          // Here: failing, held back by its dependencies (waiting or blocked), or ok.
          const state = !here ? h("span", {class: "muted"}, "no")
            : failing.has(r) ? link("/logs?filter=" + encodeURIComponent(r), pill("failing", "bad"))
            : held[r] ? link("/roles/" + encodeURIComponent(r),
              pill(held[r].state, held[r].state === "blocked" ? "bad" : "warn"))
            : pill("ok", "ok");
          return h("tr", {"data-role": r},
            h("td", {}, link("/roles/" + encodeURIComponent(r), r)),
            h("td", {}, info.version !== undefined ? String(info.version) : h("span", {class: "muted"}, "—")),
            h("td", {}, String(nodesOf(sched, r).length)),
            h("td", {}, state));
        }), {id: "roles-table"}) : h("p", {class: "muted"}, s.schedule_id ? "The schedule has no roles." : "No schedule yet."),
        h("div", {class: "toolbar", style: "margin-top:10px"}, rerender), results),
      Array.isArray(d.changes) && d.changes.length
        ? card("Changes in this schedule", h("ul", {}, d.changes.map((c) => h("li", {}, String(c))))) : null);
  }
  draw();
  return {node: root, live: draw};
}
