// The Tail page (`/tail/<path>`, `?offset=N`): one log file under /v1/log/, read in pieces, and
// followed while it grows.

import {fill, h} from "../dom.js";

/** Bytes read at a time, as 0.13 read them. */
const CHUNK = 16384;
/** How often a followed file is looked at. */
const FOLLOW_MS = 1000;

export function tailPage(ctx, file) {
  const {api, notices} = ctx;
  const params = new URLSearchParams(location.search);
  const path = "/v1/log/" + file;   // file: e.g. role/web/log.20261122054306.txt, global/latest
  const pre = h("pre", {class: "log", id: "tail"});
  const note = h("span", {class: "muted"});
  const follow = h("input", {type: "checkbox", id: "follow"});
  let start = null;   // first byte shown
  let end = 0;        // one past the last byte shown
  let timer = null;
  const root = h("div", {},
    h("h1", {}, "Log ", h("code", {}, file)),
    h("div", {class: "toolbar"},
      h("button", {type: "button", onclick: () => guarded(previous)}, "Load previous"),
      h("button", {type: "button", onclick: () => guarded(more)}, "Load more"),
      h("button", {type: "button", onclick: () => skipToEnd()}, "Skip to end"),
      h("label", {}, follow, " follow"),
      h("a", {href: path}, "raw"), note),
    pre);

  async function size() {
    // HEAD: a range past the end would be a 416 (and an error in the console) when nothing grew.
    const response = await api.head(path, {cache: "no-store"});
    return Number(response.headers.get("Content-Length") || 0);
  }
  async function read(from, to) {
    if (to <= from) return "";
    const {text} = await api.getText(path, {headers: {Range: "bytes=" + from + "-" + (to - 1)}, cache: "no-store"});
    return text;
  }
  function show(text, atEnd) {
    const lines = text.split("\n").map((l) => {
      if (/ -{12} .* -{11}/.test(l)) return h("span", {class: "marker"}, l + "\n");
      if (/^result: (error|failed)/.test(l)) return h("span", {class: "failed"}, l + "\n");
      return l + "\n";
    });
    if (lines.length && text.endsWith("\n")) lines.pop();
    if (atEnd) pre.append(...lines); else pre.prepend(...lines);
  }
  function status(total) {
    return "bytes " + start + "–" + end + " of " + total;
  }
  /** Runs `step`; a failure is shown as a notice and beside the buttons. */
  async function guarded(step) {
    try {
      await step();
    } catch (e) {
      note.textContent = e.message;
      notices.show(e);
    }
  }
  async function open() {
    try {
      const total = await size();
      const offset = params.has("offset") ? Math.min(Number(params.get("offset")) || 0, total) : Math.max(0, total - CHUNK);
      start = offset;
      end = Math.min(total, offset + CHUNK);
      fill(pre);
      show(await read(start, end), true);
      note.textContent = status(total);
      if (!params.has("offset")) { follow.checked = true; following(); }
    } catch (e) {
      pre.textContent = e.status === 404 ? "There is no log " + file + " on this node." : e.message;
      notices.show(e);
    }
  }
  async function more() {
    const total = await size();
    const to = Math.min(total, end + CHUNK);
    show(await read(end, to), true);
    end = to;
    note.textContent = status(total);
  }
  async function previous() {
    if (!start) return;
    const from = Math.max(0, start - CHUNK);
    show(await read(from, start), false);
    start = from;
  }
  async function skipToEnd() {
    params.delete("offset");
    await open();
    pre.scrollTop = pre.scrollHeight;
  }
  async function poll() {
    const total = await size();
    if (total < end) { await open(); return; }   // the file was replaced
    if (total > end) {
      const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      show(await read(end, total), true);
      end = total;
      note.textContent = status(total);
      if (stick) pre.scrollTop = pre.scrollHeight;
    }
  }
  function following() {
    clearInterval(timer);
    timer = follow.checked ? setInterval(() => guarded(poll), FOLLOW_MS) : null;
  }
  follow.addEventListener("change", following);
  open();
  return {node: root, leave: () => clearInterval(timer)};
}
