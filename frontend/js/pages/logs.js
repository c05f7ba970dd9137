// The Logs page (`/logs`, `/logs?filter=<role>`, `/logs?filter=-`): the deployment log's index.

import {BASE, card, failed, fill, h, link, pill, table, when} from "../dom.js";
import {loadIndex, tailPath} from "../logindex.js";
import {deploymentKey} from "../state.js";

/** Rows shown at most, newest first. */
const ROWS_SHOWN = 200;

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
    const shown = entries.filter((e) => !filter || (filter === "-" ? !e.role : e.role === filter)).slice(0, ROWS_SHOWN);
    const failing = new Set((state.status && state.status.failed_roles) || []);
    fill(body, card(null, shown.length ? table(["Time", "Deployment", "Where", "Event", ""], shown.map((e) =>
      h("tr", {},
        h("td", {}, when(e.ms)),
        h("td", {class: "mono"}, e.deployment),
        h("td", {}, e.role ? [link("/roles/" + encodeURIComponent(e.role), e.role), failing.has(e.role) ? [" ", pill("failing", "bad")] : null]
          : h("span", {class: "muted"}, (e.kind || "").toLowerCase())),
        h("td", {}, e.marker, e.detail ? h("span", {class: "muted"}, " " + e.detail) : null),
        h("td", {}, link(tailPath(e), "view")))), {id: "log-rows"})
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
  }
  refresh.addEventListener("click", load);
  draw();
  // New deployments follow schedule changes and re-renders: re-read the index on those.
  return {node: root, live: (prev) => {
    const s = state.status;
    if (!prev || deploymentKey(prev) !== deploymentKey(s) || prev.schedule_id !== s.schedule_id) load();
  }};
}
