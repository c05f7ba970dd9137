// The Logs page (`/logs`, `/logs?filter=<role>`, `/logs?filter=-`): the deployment log's index.

import {BASE, card, failed, fill, h, link, pill, table, when} from "../dom.js";
import {loadIndex, tailPath, textsAfter} from "../logindex.js";
import {deploymentKey} from "../state.js";

/** Deployments shown at most, newest first. */
const ROWS_SHOWN = 200;

/** The index entries (newest first) grouped by deployment, newest first: {id, events, roles}. */
function byDeployment(entries) {
  const groups = new Map();
  for (const e of entries) {
    if (!groups.has(e.deployment)) groups.set(e.deployment, {id: e.deployment, events: [], roles: []});
    const d = groups.get(e.deployment);
    d.events.push(e);
    if (e.role && !d.roles.includes(e.role)) d.roles.push(e.role);
  }
  for (const d of groups.values()) d.roles.sort();
  return [...groups.values()];
}

/** `ok`, `failed: <roles>` or `blocked` from the line after the deployment's DeploymentFinish. */
function deploymentResult(state, d, texts) {
  const finish = d.events.find((e) => e.marker === "DeploymentFinish");
  if (!finish) {
    const last = state.status && state.status.last_deployment;
    return last && last.id === d.id && !last.finished ? pill("running", "warn")
      : d.events.some((e) => e.marker === "DeploymentStart")
        ? h("span", {class: "muted", title: "No DeploymentFinish in the index"}, "unfinished") : null;
  }
  if (texts === null) return h("span", {class: "muted"}, "…");
  if (texts instanceof Error) return h("span", {class: "muted", title: texts.message}, "?");
  const text = texts.get(finish);
  if (text === undefined) return h("span", {class: "muted", title: "Before the last MiB of the global log"}, "?");
  if (text.startsWith("all roles applied")) return pill("ok", "ok");
  const failedRoles = /^failed roles: (.*)$/m.exec(text);
  const blocked = [...text.matchAll(/^blocked role (\S+):/gm)].map((m) => m[1]);
  return h("span", {title: text},
    failedRoles ? pill("failed: " + failedRoles[1], "bad") : null,
    failedRoles && blocked.length ? " " : null,
    blocked.length ? pill("blocked: " + blocked.join(", "), "warn") : null);
}

export function logsPage(ctx) {
  const {state, api, notices} = ctx;
  const root = h("div", {});
  const params = new URLSearchParams(location.search);
  let filter = params.get("filter") || "";
  const select = h("select", {id: "log-filter"});
  const body = h("div", {});
  const refresh = h("button", {type: "button"}, "Refresh");
  // null while loading, {entries, unreadable}, or the error that kept the index away.
  let index = null;
  // The text after the global log's markers (textsAfter), null until read, or the error.
  let texts = null;
  // Deployments opened to show their events; kept across redraws.
  const opened = new Set();
  root.append(h("h1", {}, "Deployment log"),
    h("div", {class: "toolbar"}, "Show ", select, refresh,
      h("a", {href: "/v1/log/index/latest"}, "raw index"), link("/tail/global/latest", "global log"),
      link("/tail/changes/latest", "changes log")),
    body);
  select.addEventListener("change", () => {
    filter = select.value;
    history.replaceState(null, "", BASE + "/logs" + (filter ? "?filter=" + encodeURIComponent(filter) : ""));
    draw();
  });
  function draw() {
    const entries = index && !(index instanceof Error) ? index.entries : [];
    const roles = new Set(entries.filter((e) => e.role).map((e) => e.role));
    if (filter && filter !== "-") roles.add(filter);
    fill(select, h("option", {value: ""}, "everything"), h("option", {value: "-"}, "deployments only (no role)"),
      [...roles].sort().map((r) => h("option", {value: r}, "role " + r)));
    select.value = filter;
    if (index === null) { fill(body, card(null, h("p", {class: "muted"}, "Loading…"))); return; }
    if (index instanceof Error) { fill(body, card(null, failed("No deployment log", index))); return; }
    const matches = (e) => !filter || (filter === "-" ? !e.role : e.role === filter);
    const shown = byDeployment(entries).filter((d) => d.events.some(matches)).slice(0, ROWS_SHOWN);
    const failing = new Set((state.status && state.status.failed_roles) || []);
    const rows = shown.flatMap((d) => {
      const isOpen = opened.has(d.id);
      const toggle = h("button", {type: "button", class: "toggle", "aria-expanded": String(isOpen), onclick: () => {
        if (isOpen) opened.delete(d.id); else opened.add(d.id);
        draw();
      }}, isOpen ? "▾ " : "▸ ", h("span", {class: "mono"}, d.id));
      const start = d.events.find((e) => e.marker === "DeploymentStart");
      const hash = start && texts instanceof Map ? /^schedule-hash: (\S+)/m.exec(texts.get(start) || "") : null;
      const main = h("tr", {class: "deployment", "data-deployment": d.id},
        h("td", {}, when(d.events[d.events.length - 1].ms)),
        h("td", {}, toggle),
        h("td", {class: "mono", title: hash ? hash[1] : ""}, hash ? hash[1].slice(0, 8) : ""),
        h("td", {}, d.roles.map((r) => [link("/roles/" + encodeURIComponent(r), r),
          failing.has(r) ? [" ", pill("failing", "bad")] : null, " "])),
        h("td", {class: "result"}, deploymentResult(state, d, texts)),
        h("td", {}, start ? link(tailPath(start), "log") : null));
      if (!isOpen) return [main];
      const detail = table(["Time", "Where", "Event", ""], d.events.filter(matches).reverse().map((e) => h("tr", {},
        h("td", {}, when(e.ms)),
        h("td", {}, e.role ? [link("/roles/" + encodeURIComponent(e.role), e.role), failing.has(e.role) ? [" ", pill("failing", "bad")] : null]
          : h("span", {class: "muted"}, (e.kind || "").toLowerCase())),
        h("td", {}, e.marker, e.detail ? h("span", {class: "muted"}, " " + e.detail) : null),
        h("td", {}, link(tailPath(e), "view")))), {class: "events"});
      return [main, h("tr", {class: "detail", "data-deployment": d.id}, h("td", {colspan: "6"}, detail))];
    });
    fill(body, card(null, shown.length ? table(["Time", "Deployment", "Schedule", "Roles", "Result", ""], rows, {id: "log-rows"})
      : h("p", {class: "muted"}, "Nothing logged for this filter."),
    index.unreadable ? h("p", {class: "failed-here"}, index.unreadable + " line(s) of the index are not index lines and are left out.") : null));
  }
  async function load() {
    try {
      index = await loadIndex(api);
    } catch (e) {
      index = e;
      notices.show(e);
    }
    draw();
    if (index instanceof Error) return;
    // The schedule of each deployment and its result: the lines after its DeploymentStart and
    // DeploymentFinish in the global log.
    const read = index;
    let got;
    try {
      got = await textsAfter(api, read.entries.filter((e) => e.marker === "DeploymentStart" || e.marker === "DeploymentFinish"));
    } catch (e) {
      got = e;
      notices.show(e);
    }
    if (index === read) { texts = got; draw(); }
  }
  refresh.addEventListener("click", load);
  draw();
  // New deployments follow schedule changes and re-renders: re-read the index on those.
  return {node: root, live: (prev) => {
    const s = state.status;
    if (!prev || deploymentKey(prev) !== deploymentKey(s) || prev.schedule_id !== s.schedule_id) load();
  }};
}
