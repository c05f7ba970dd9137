// Which page the URL asks for, and moving between pages without reloading: links marked
// `data-link`, Back and Forward.

import {BASE, card, fill, h, link} from "./dom.js";
import {apiPage} from "./pages/api-links.js";
import {backupsPage} from "./pages/backups.js";
import {datacentersPage} from "./pages/datacenters.js";
import {graphqlPage} from "./pages/graphql.js";
import {logsPage} from "./pages/logs.js";
import {nodesPage} from "./pages/nodes.js";
import {overviewPage} from "./pages/overview.js";
import {rolesPage} from "./pages/roles.js";
import {schedulePage} from "./pages/schedule.js";
import {schedulerPage} from "./pages/scheduler.js";
import {shadowPage} from "./pages/shadow.js";
import {tailPage} from "./pages/tail.js";

/** The path as typed, when it holds an escape that does not decode (it is then shown as is). */
function decoded(path) {
  try {
    return decodeURIComponent(path);
  } catch (e) {
    return path;
  }
}

/** The page for the current URL: {node, live?(previous status), leave?()}. */
function pageFor(ctx) {
  const path = decoded(location.pathname.slice(BASE.length)).replace(/\/+$/, "") || "/";
  const parts = path.split("/").filter(Boolean);
  switch (parts[0]) {
    case undefined: return overviewPage(ctx);
    case "roles": return rolesPage(ctx, parts[1] || null);
    case "nodes": case "peers": return nodesPage(ctx);
    case "schedule": return schedulePage(ctx);
    case "scheduler": return schedulerPage(ctx);
    case "shadow": return shadowPage(ctx);
    case "datacenters": return datacentersPage(ctx);
    case "logs": return logsPage(ctx);
    case "tail": return tailPage(ctx, location.pathname.slice(BASE.length + "/tail/".length));
    case "backups": return backupsPage(ctx);
    case "api": return apiPage(ctx);
    case "v1": if (parts[1] === "graphiql" && parts.length === 2) return graphqlPage(ctx);
      // Other /v1/ paths are the API's, not pages.
      break;
  }
  return {node: card(null, h("p", {}, "No page ", h("code", {}, path), ". ", link("/", "Overview")))};
}

/** The router of the page in `main`; `show()` draws the page the URL asks for. */
export function createRouter(ctx, main) {
  let current = null;

  function show() {
    if (current && current.leave) current.leave();
    ctx.notices.leavePage();
    current = pageFor(ctx);
    // Until the first status comes every page has little or nothing to show: say so above it.
    fill(main, ctx.state.status ? null : h("p", {class: "muted loading", id: "status-loading"},
      "Loading the status of this node…"), current.node);
    // A page opened after the first status: it sees the status as new (live(null)).
    if (ctx.state.status && current.live) current.live(null);
    const section = "/" + (location.pathname.slice(BASE.length).split("/")[1] || "");
    for (const a of document.querySelectorAll("#nav a")) {
      const target = a.getAttribute("href");
      a.classList.toggle("active", target === BASE + section || (section === "/tail" && target === BASE + "/logs")
        || (section === "/v1" && target === BASE + "/v1/graphiql"));
    }
  }

  /** After a new status (`previous` is the one before, or null): the open page updates. */
  function live(previous) {
    const waiting = document.getElementById("status-loading");
    if (waiting) waiting.remove();
    if (current && current.live) current.live(previous);
  }

  function follow(e) {
    const a = e.target.closest && e.target.closest("a[data-link]");
    if (!a || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
    e.preventDefault();
    const href = a.getAttribute("href");
    history.pushState(null, "", href.startsWith(BASE) ? href : BASE + href);
    show();
    window.scrollTo(0, 0);
  }

  document.addEventListener("click", follow);
  window.addEventListener("popstate", show);
  // Header links are written without BASE; fix them once when served under /~common/.
  if (BASE) for (const a of document.querySelectorAll("a[data-link]")) a.setAttribute("href", BASE + a.getAttribute("href"));
  return {show, live};
}
