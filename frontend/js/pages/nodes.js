// The Nodes page (`/nodes`, also `/peers`): this node and every peer, with their roles.

import {card, fill, h, link, pill, short, table, when} from "../dom.js";
import {isLeader} from "../state.js";

/** When peers were last heard from moves without a status event: the list is read again this often. */
const PEERS_REFRESH_MS = 5000;

/**
 * Whether this node hears the peer, as it judges it itself (`alive` of /v1/peers: heard from
 * directly, through cantal or an election packet, within election.minority-window-ms), and when.
 */
function heard(p) {
  const mark = p.alive ? pill("alive", "ok") : pill(p.last_heard ? "silent" : "not heard", "bad");
  return [mark, p.last_heard ? [" ", when(p.last_heard)] : null];
}

export function nodesPage(ctx) {
  const {state, api, notices} = ctx;
  const root = h("div", {});
  function draw() {
    const s = state.status;
    if (!s) return;
    const d = (state.schedule && state.schedule.data) || {};
    const nodes = d.nodes || {};
    const self = {id: s.id, hostname: s.hostname, name: s.name, primary_addr: null, self: true,
      known_since: null, last_report_direct: null, errors: s.num_errors,
      schedule: s.schedule_id ? {hash: s.schedule_id} : null};
    const all = [self, ...state.peers];
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
        h("td", {}, !p.self && !isLeader(state) ? h("span", {class: "muted"}, "—")
          : p.errors ? pill(p.errors + " error(s)", "bad") : pill("ok", "ok")),
        h("td", {class: "mono", title: (p.schedule && p.schedule.hash) || ""}, p.schedule ? short(p.schedule.hash) : "—"),
        h("td", {class: "heard"}, p.self ? "—" : heard(p)),
        h("td", {}, p.self ? "—" : when(p.known_since)),
        h("td", {class: "mono muted id"}, p.id));
    });
    const extra = Object.keys(nodes).filter((n) => !all.some((p) => p.hostname === n)).sort();
    // Who elects the leader (docs/etcd.md): verwalter's own election or an etcd lease.
    const etcd = s.election_backend === "etcd" && s.etcd;
    const backend = h("p", {id: "election-backend", class: "muted"}, "Leader elected by ",
      etcd ? ["etcd (", h("span", {class: "mono"}, etcd.prefix), ", leadership revision ",
        String(etcd.leader_rev === null ? "—" : etcd.leader_rev),
        etcd.connected ? "" : ", etcd not reachable", ")"] : "verwalter's own election", ".");
    fill(root, h("h1", {}, "Nodes"),
      card(null, table(["Host", "Name", "Address", "Roles", "Errors", "Schedule", "Heard", "Known since", "Id"], rows, {id: "nodes"}),
        isLeader(state) ? null : h("p", {class: "muted"}, "Errors of other nodes reach the leader only."), backend),
      extra.length ? card("In the schedule, not in the peer list", h("p", {}, extra.join(", "))) : null);
  }
  async function refresh() {
    try {
      state.peers = await api.getJson("/v1/peers");
      draw();
    } catch (e) {
      notices.show(e);
    }
  }
  draw();
  const timer = setInterval(refresh, PEERS_REFRESH_MS);
  return {node: root, live: draw, leave: () => clearInterval(timer)};
}
