// The Data centers page (`/datacenters`): this node's data center and every other one as the
// exchange between DC leaders sees it (docs/datacenters.md), from `/v1/datacenters`, asked again
// every 2 s while the page is open (links go down and ages move on without a status event). On a
// node in no DC (`404`) it says so and how to set one.

import {card, failed, fill, h, kv, pill, short, table} from "../dom.js";
import {leaderUrl} from "../state.js";

const REFRESH_MS = 2000;
/** Where the settings are explained (the page loads nothing from there; it is only a link). */
const DOCS = "https://github.com/verwalter/verwalter/blob/HEAD/docs/datacenters.md";

/** A duration in ms as words: "850 ms", "12 s", "4 min", "2 h". */
function span(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return Math.round(ms) + " ms";
  const s = ms / 1000;
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  return Math.round(s / 3600) + " h";
}

function ageText(ms) {
  return ms === null || ms === undefined ? h("span", {class: "muted"}, "never") : span(ms) + " ago";
}

function bytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1024 / 1024).toFixed(1) + " MiB";
}

function linkPill(link) {
  return pill(link, link === "up" ? "ok" : link === "down" ? "bad" : "warn");
}

/** The grants and requests between this DC and `dc`: one row each, with the time left. */
function grantRows(name, dc) {
  const rows = [];
  const row = (kind, id, left, data) => rows.push(h("tr", {"data-dc": name, "data-kind": kind},
    h("td", {}, name), h("td", {}, kind), h("td", {class: "mono"}, id), h("td", {}, span(left)),
    h("td", {}, data === undefined ? null : h("code", {}, JSON.stringify(data)))));
  for (const a of dc.answers || []) row("borrowed", a.request, a.expires_in_ms, a.data);
  for (const l of dc.lent || []) row("lent", l.request, l.outstanding_ms);
  for (const r of dc.requests || []) row("requested from us", r.id, r.expires_in_ms, r.data);
  return rows;
}

/** What the page shows of `/v1/datacenters` (`list`) with the status. */
function view(state, list) {
  const s = state.status;
  const leading = list.leading;
  const names = [...new Set([...Object.keys(list.members || {}), ...Object.keys(list.dcs || {})])].sort();
  const leaderName = leading ? (s ? s.name : "this node") : (s && s.leader ? s.leader.name : null);
  const url = leading ? null : leaderUrl(state, "/datacenters");
  const own = h("tr", {"data-dc": list.self, class: "own"},
    h("td", {}, h("strong", {}, list.self), " ", pill("this DC")),
    h("td", {}, leaderName ? leaderName : h("span", {class: "muted"}, "no leader"),
      leading ? " (this node)" : list.leader ? h("span", {class: "muted"}, " " + list.leader) : null),
    h("td", {}, "—"), h("td", {}, "—"), h("td", {}, "—"), h("td", {}, "—"), h("td", {}, "—"),
    h("td", {class: "mono"}, list.addr));
  const others = names.map((name) => {
    const dc = (list.dcs || {})[name];
    const addrs = (list.members || {})[name] || [];
    if (!dc) {
      return h("tr", {"data-dc": name},
        h("td", {}, h("strong", {}, name)),
        h("td", {colspan: 6, class: "muted"}, "Only this DC's leader exchanges with it."),
        h("td", {class: "mono"}, addrs.join(", ")));
    }
    const grants = (dc.answers || []).length + (dc.lent || []).length;
    const marks = [dc.summary_behind ? pill("newer one coming", "warn") : null,
      dc.summary_deferred ? pill("ours waits for the cap", "warn") : null];
    return h("tr", {"data-dc": name},
      h("td", {}, h("strong", {}, name)),
      h("td", {class: "mono", title: dc.leader || ""}, dc.leader ? short(dc.leader) : h("span", {class: "muted"}, "unknown")),
      h("td", {class: "dc-link"}, linkPill(dc.link), " ", dc.rtt_ms !== null ? span(dc.rtt_ms) + " RTT" : null,
        (list.errors || {})[name] ? [" ", pill("failing", "bad")] : null),
      h("td", {}, ageText(dc.contact_age_ms)),
      h("td", {}, ageText(dc.summary_age_ms), " ", marks),
      h("td", {}, grants ? (dc.answers || []).length + " borrowed, " + (dc.lent || []).length + " lent"
        : h("span", {class: "muted"}, "none")),
      h("td", {}, bytes(dc.bytes_sent) + " sent, " + bytes(dc.bytes_received) + " received"),
      h("td", {class: "mono"}, addrs.join(", ")));
  });
  const grants = names.flatMap((name) => (list.dcs || {})[name] ? grantRows(name, list.dcs[name]) : []);
  const off = list.exchange !== "on";
  const errors = Object.entries(list.errors || {});
  // Entries of the scheduler's `datacenters` output that could not be used (the rest was).
  const unused = s && s.errors ? s.errors.scheduler_datacenters : null;
  return [
    unused ? h("div", {class: "banner bad", id: "dc-scheduler-errors"},
      h("strong", {}, "The scheduler's datacenters output, entries not used: "), unused) : null,
    off ? h("div", {class: "banner bad", id: "dc-exchange-off"}, h("strong", {}, "The exchange is " + list.exchange + ": "),
      "this DC's leader does not talk to the other DCs. The election's key signs every exchange: set election.key-file on every node (",
      h("a", {href: DOCS + "#settings"}, "docs/datacenters.md"), ").") : null,
    card(null, kv([
      ["this data center", h("strong", {id: "dc-self"}, list.self)],
      ["this node", leading ? "leads it and exchanges with the other DCs"
        : ["follows ", leaderName || "no leader yet", url ? [" · ", h("a", {href: url}, "open this page on the leader")] : null]],
      ["exchange", list.exchange],
      ["other DCs call it at", h("span", {class: "mono"}, list.addr)],
    ])),
    errors.length ? card("Errors", table(["Data center", "Last exchange failed", "When"], errors.map(([name, e]) =>
      h("tr", {"data-dc": name}, h("td", {class: "mono"}, name), h("td", {}, h("pre", {}, e.error)), h("td", {}, ageText(e.age_ms)))),
    {id: "dc-errors"})) : null,
    card("Data centers", table(["Data center", "Leader", "Link", "Last contact", "Summary", "Grants", "Traffic", "Addresses"],
      [own, others], {id: "dc-table"}),
    names.length ? null : h("p", {class: "muted"}, "No other data center is known: none in the peer list, no datacenters.entry-points.")),
    leading ? card("Grants and requests", grants.length
      ? table(["Data center", "Kind", "Request", "Time left", "Data"], grants, {id: "dc-grants"})
      : h("p", {class: "muted", id: "dc-grants"}, "Nothing is lent or borrowed, and no DC asks this one for anything.")) : null,
  ];
}

export function datacentersPage(ctx) {
  const {state, api, notices} = ctx;
  const head = () => h("h1", {}, "Data centers");
  const root = h("div", {}, head(), card(null, h("p", {class: "muted"}, "Loading…")));
  let timer = null;
  let busy = false;
  let last = null;

  function draw() {
    if (last) fill(root, head(), view(state, last));
  }

  async function load() {
    if (busy) return;
    busy = true;
    try {
      last = await api.getJson("/v1/datacenters");
      draw();
    } catch (e) {
      last = null;
      if (e.status === 404) {
        // In no DC until the node restarts with other settings: no use asking again.
        clearInterval(timer);
        fill(root, head(), card(null, h("p", {id: "dc-none"}, "This node is in no data center: it elects and schedules with its peers "
          + "as one cluster, and exchanges with no other. Give each node its DC with ", h("code", {}, "datacenter:"),
          " in its settings (or ", h("code", {}, "--datacenter NAME"), "), and the other DCs' entry points with ",
          h("code", {}, "datacenters.entry-points:"), ": ", h("a", {href: DOCS + "#settings"}, "docs/datacenters.md"), ".")));
      } else {
        notices.show(e);
        fill(root, head(), card(null, failed("Cannot read the data centers", e)));
      }
    } finally {
      busy = false;
    }
  }

  load();
  timer = setInterval(load, REFRESH_MS);
  return {node: root, live: draw, leave: () => clearInterval(timer)};
}
