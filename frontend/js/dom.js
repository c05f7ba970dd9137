// DOM helpers: building elements from data, and the small pieces every page uses.

/** `/~common` when the page is served as an alternative-frontend path, else "". */
export const BASE = location.pathname.startsWith("/~common") ? "/~common" : "";

/** Builds an element: h("a", {href: "/x", onclick: f}, "text", child, [more, children]). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    // Through the CSSOM: the Content-Security-Policy refuses style attributes set as text.
    else if (name === "style") el.style.cssText = String(value);
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

/** Replaces an element's children; null, false and undefined children are left out. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** A link inside the frontend: followed without reloading the page. */
export function link(path, ...children) {
  return h("a", {href: BASE + path, "data-link": true}, ...children);
}

export function pill(text, kind) {
  return h("span", {class: "pill " + (kind || "")}, text);
}

export function card(title, ...children) {
  return h("section", {class: "card"}, title ? h("h2", {}, title) : null, ...children);
}

export function kv(pairs) {
  return h("dl", {class: "kv"}, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

export function table(headers, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows));
}

/** A red line in place of what could not be loaded; the notice above says the same in full. */
export function failed(what, error) {
  return h("p", {class: "failed-here"}, what + ": " + error.message);
}

export function short(hash) {
  return hash ? hash.slice(0, 8) : "none";
}

export function ago(ms) {
  if (ms === null || ms === undefined) return "never";
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 0) return "just now";
  if (s < 90) return s + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  if (s < 129600) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " days ago";
}

/** A time with its age, kept current by `tickAges`. */
export function when(ms) {
  if (ms === null || ms === undefined) return h("span", {class: "muted"}, "never");
  return h("time", {datetime: new Date(ms).toISOString(), title: new Date(ms).toISOString(),
    "data-ago": ms}, ago(ms));
}

/** Moves every age on the page on ("12 s ago" a second later). */
export function tickAges() {
  for (const t of document.querySelectorAll("time[data-ago]")) t.textContent = ago(Number(t.dataset.ago));
}

export function json(value) {
  return JSON.stringify(value, null, 2);
}
