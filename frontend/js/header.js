// The header and the banners, on every page: counts, the error and leader badges, the stream's
// state, failing roles and nodes.

import {fill, h, link} from "./dom.js";
import {isLeader, leaderUrl} from "./state.js";

/** The stream's state in the header: live, or reconnecting while it is down. */
export function showLive(state, on) {
  state.live = on;
  const el = document.getElementById("live");
  el.className = on ? "on" : "off";
  el.textContent = on ? "live" : "reconnecting";
}

export function renderHeader(state) {
  const s = state.status;
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
  } else if (isLeader(state)) {
    leader.append("Leader: this node · " + s.schedule_status);
  } else {
    leader.append("Leader: ", h("a", {href: leaderUrl(state, "/")}, s.leader.name), " · " + s.schedule_status);
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
