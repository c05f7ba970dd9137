// The Schedule page (`/schedule`): the schedule in force as a tree, built as it is opened.

import {card, fill, h, kv, when} from "../dom.js";
import {originName} from "../parts.js";

/** Rounds of `Expand all`: each opens the branches the round before built. */
const EXPAND_ROUNDS = 64;

export function schedulePage(ctx) {
  const {state} = ctx;
  const root = h("div", {});
  let drawnFor;
  function draw() {
    const sched = state.schedule;
    if (sched && drawnFor === sched.hash) return;
    drawnFor = sched && sched.hash;
    if (!sched) {
      fill(root, h("h1", {}, "Schedule"), card(null, h("p", {class: "muted"}, "No schedule yet.")));
      return;
    }
    const tree = h("div", {class: "tree-root", id: "schedule-tree"},
      treeNode(state.ui.openPaths, "data", sched.data, "$"));
    fill(root, h("h1", {}, "Schedule"),
      card(null, kv([["hash", h("span", {class: "mono"}, sched.hash)], ["made", when(sched.timestamp)],
        ["by", originName(state, sched.origin)]]),
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
function treeNode(openPaths, key, value, path) {
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
    details.append(...entries.map(([k, v]) => treeNode(openPaths, k, v, path + "/" + k)));
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
  for (let round = 0; round < EXPAND_ROUNDS; round++) {
    const pending = [...tree.querySelectorAll("details.tree")].filter((d) => d.open !== open);
    if (!pending.length) return;
    for (const d of pending) {
      d.open = open;
      d.dispatchEvent(new Event("toggle"));
    }
  }
}
