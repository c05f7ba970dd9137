// The Shadow page (`/shadow`): the leader's shadow schedulers (docs/scheduler.md#shadow-schedulers),
// each with its latest run, the diff against the real schedule, and its history; for a shadow
// whose latest run differs, a shadow render of one of this node's roles from its schedule
// (`POST /v1/shadow/render/<role>` with `{"shadow": name}`) and the file diff it gives.

import {card, failed, fill, h, json, pill, short, table, when} from "../dom.js";
import {allRoles, isLeader, leaderUrl, roleIsHere} from "../state.js";

/** How often the page asks again while open (a shadow run ends after the real round). */
const REFRESH_MS = 2000;

function result(run) {
  switch (run.result) {
    case "identical": return pill("identical", "ok");
    case "differs": return pill("differs in " + run.paths_differing + (run.paths_differing === 1 ? " path" : " paths"), "warn");
    case "real_failed": return pill("real run failed", "warn");
    case "failed": return pill("failed", "bad");
    case "skipped": return pill("skipped", "warn");
    default: return pill(String(run.result));
  }
}

function value(v) {
  return v === undefined ? h("span", {class: "muted"}, "—") : h("code", {}, JSON.stringify(v));
}

/** A run's diff: the roles and nodes it touches, then each differing path. */
function diffView(run) {
  const d = run.diff;
  if (run.error) return h("div", {class: "banner bad"}, h("strong", {}, run.error.kind + ": "), h("pre", {}, run.error.message));
  if (run.skipped) return h("p", {class: "muted"}, "Skipped: still busy with run " + run.skipped.busy_with + ".");
  if (!d) return h("p", {class: "muted"}, "Not compared: the real run failed (" + (run.real_error || "") + ").");
  if (d.identical) return h("p", {class: "shadow-identical"}, "Identical to the real schedule.");
  const names = [];
  for (const part of ["roles", "nodes"]) {
    for (const kind of ["added", "removed", "changed"]) {
      if (d[part][kind].length) names.push(h("li", {}, part + " " + kind + ": ", h("strong", {}, d[part][kind].join(", "))));
    }
  }
  const sign = {added: "+", removed: "−", changed: "~"};
  return h("div", {},
    names.length ? h("ul", {class: "shadow-names"}, names) : null,
    table(["", "Path", "Real", "Shadow"], d.changes.map((c) => h("tr", {class: "change-" + c.kind},
      h("td", {}, sign[c.kind] || c.kind), h("td", {}, h("code", {}, c.path)),
      h("td", {}, value(c.real)), h("td", {}, value(c.shadow)))), {class: "shadow-changes"}),
    d.truncated ? h("p", {class: "muted"}, "More paths differ than are listed (" + d.paths_differing + " in all).") : null);
}

/** A unified diff, its added and removed lines marked. */
function unifiedDiff(text) {
  return h("pre", {class: "log shadow-file-diff"}, text.split("\n").filter((l, i, all) => l || i < all.length - 1).map((l) => {
    const kind = l.startsWith("+++") || l.startsWith("---") ? "marker" : l.startsWith("+") ? "diff-add" : l.startsWith("-") ? "diff-del" : null;
    return h("span", {class: kind}, l + "\n");
  }));
}

/** What a shadow render answered: a summary line, then each differing file's diff. */
function renderResult(r) {
  const same = r.unchanged.length;
  return h("div", {class: "shadow-render-result"},
    h("p", {}, h("strong", {}, r.role), ": templates/" + r.real_template + " → templates/" + r.shadow_template + ": "
      + r.files.length + " differing, " + same + " the same; no command was run"),
    r.files.map((f) => h("div", {},
      h("p", {}, h("code", {}, f.file), " ", pill(f.kind, f.kind === "changed" ? "warn" : "")),
      unifiedDiff(f.diff))));
}

/** The shadow render box of `name`: a button per role of this node, and the last answer. */
function renderBox(name, roles, asked, ask) {
  let answer = null;
  if (asked && asked.pending) answer = h("p", {class: "muted"}, "Rendering " + asked.role + "…");
  else if (asked && asked.error) answer = h("div", {class: "banner bad"}, h("strong", {}, asked.role + ": "), asked.error);
  else if (asked) answer = renderResult(asked.result);
  return h("div", {id: "shadow-render-" + name},
    h("h3", {}, "Shadow render"),
    h("p", {class: "muted"}, "Render one of this node's roles with the variables of this shadow's schedule "
      + "(the same templates; no command runs) and compare the files with the real schedule's:"),
    roles.length ? h("p", {}, roles.map((role) => [h("button", {type: "button", class: "shadow-render-role",
      onclick: () => ask(name, role)}, role), " "]))
      : h("p", {class: "muted"}, "This node has no roles."),
    answer);
}

/** One shadow: its latest (or chosen) run whole, and its history. */
function shadowCard(name, run, runs, choose, render) {
  const meta = run ? h("p", {class: "muted"}, "Run " + run.run + " ", when(run.time),
    " · input " + short(run.input_hash) + " · real schedule " + short(run.real_hash)
    + (run.duration_ms !== null ? " · " + run.duration_ms + " ms" : "")
    + (run.memory_bytes !== null && run.memory_bytes !== undefined ? " · " + Math.round(run.memory_bytes / 1024) + " KiB" : "")) : null;
  return card("Shadow " + name,
    run ? [h("div", {class: "shadow-result"}, result(run)), meta, h("div", {id: "shadow-diff-" + name}, diffView(run)),
      run.log ? h("details", {}, h("summary", {}, "log"), h("pre", {class: "log"}, run.log)) : null,
      run.output ? h("details", {}, h("summary", {}, "output"), h("pre", {class: "log"}, json(run.output))) : null,
      render]
      : h("p", {class: "muted"}, "No run yet."),
    h("h3", {}, "History"),
    table(["Run", "When", "Result", "Input"], runs.map((r) => h("tr", {},
      h("td", {}, h("a", {href: "#", onclick: (e) => { e.preventDefault(); choose(name, r.run); }}, String(r.run))),
      h("td", {}, when(r.time)), h("td", {}, result(r)), h("td", {}, h("code", {}, short(r.input_hash))))),
    {id: "shadow-history-" + name}));
}

export function shadowPage(ctx) {
  const {state, api, notices} = ctx;
  const root = h("div", {}, h("h1", {}, "Shadow schedulers"), card(null, h("p", {class: "muted"}, "Loading…")));
  const chosen = {};
  // Each shadow's last shadow render asked on this page: {role, pending} | {role, result} | {role, error}.
  const renders = {};
  let timer = null;
  let busy = false;

  async function load() {
    if (busy) return;
    busy = true;
    try {
      const list = await api.getJson("/v1/shadow");
      const cards = [];
      for (const s of list.shadows) {
        const runs = (await api.getJson("/v1/shadow/" + encodeURIComponent(s.name) + "/runs").catch(() => ({runs: []}))).runs;
        const id = chosen[s.name] || (s.latest && s.latest.run);
        const run = id ? await api.getJson("/v1/shadow/" + encodeURIComponent(s.name) + "/runs/" + id).catch(() => null) : null;
        // Only the latest run's output is rendered from, and only one that differs changes anything.
        const latest = s.latest && s.latest.result === "differs";
        const roles = allRoles(state.schedule).filter((r) => roleIsHere(state, r));
        const render = latest ? renderBox(s.name, roles, renders[s.name], renderRole) : null;
        cards.push(shadowCard(s.name, run, runs, choose, render));
      }
      const url = isLeader(state) ? null : leaderUrl(state, "/shadow");
      fill(root, h("h1", {}, "Shadow schedulers"),
        url ? h("p", {}, "Only the leader runs shadow schedulers: ", h("a", {href: url}, "open this page on the leader")) : null,
        list.problems.length ? h("div", {class: "banner bad", id: "shadow-problems"}, h("strong", {}, "scheduler/shadow.yaml: "),
          h("ul", {}, list.problems.map((p) => h("li", {}, p)))) : null,
        list.shadows.length ? table(["Shadow", "Latest", "When"], list.shadows.map((s) => h("tr", {},
          h("td", {}, s.name, s.configured ? null : h("span", {class: "muted"}, " (no longer named)")),
          h("td", {}, s.latest ? result(s.latest) : h("span", {class: "muted"}, "no run yet"),
            s.write_error ? h("div", {class: "bad", id: "shadow-write-error-" + s.name}, "Not kept on disk: " + s.write_error) : null),
          h("td", {}, s.latest ? when(s.latest.time) : null))), {id: "shadow-list"})
          : card(null, h("p", {class: "muted", id: "shadow-list"},
            "No shadow schedulers: name candidates under scheduler/ in scheduler/shadow.yaml.")),
        cards);
    } catch (e) {
      notices.show(e);
      fill(root, h("h1", {}, "Shadow schedulers"), card(null, failed("Cannot read the shadow schedulers", e)));
    } finally {
      busy = false;
    }
  }

  async function renderRole(name, role) {
    renders[name] = {role, pending: true};
    load();
    try {
      const answer = await api.postJson("/v1/shadow/render/" + encodeURIComponent(role), {shadow: name});
      renders[name] = {role, result: answer.body};
    } catch (e) {
      renders[name] = {role, error: e.message};
    }
    load();
  }

  function choose(name, id) {
    chosen[name] = id;
    load();
  }

  load();
  timer = setInterval(load, REFRESH_MS);
  return {node: root, leave: () => clearInterval(timer)};
}
