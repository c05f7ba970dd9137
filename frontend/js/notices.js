// The notice area under the banners: every failure the page meets, in words that name what
// failed and why. A notice is keyed by what failed (a request's method and path, or a script
// error's text): the same failure again updates its notice, the same request succeeding removes
// it. Notices of the page left behind are removed on navigation; those of the status stream, the
// data behind every page and script errors stay until they recover or are dismissed.

import {h} from "./dom.js";

export function createNotices(container) {
  const shown = new Map();   // key -> {el, text, count, keep}

  /**
   * Shows `error`: a RequestFailed, or a string; `keep`: past navigation. Any other error a page
   * caught is a fault of the page: it is shown as a script error and logged to the console.
   */
  function show(error, options) {
    let keep = !!(options && options.keep);
    let message = typeof error === "string" ? error : error.message;
    if (typeof error !== "string" && error.name !== "RequestFailed") {
      console.error(error);
      message = "Script error: " + message;
      keep = true;
    }
    const key = (error && error.key) || message;
    let entry = shown.get(key);
    if (!entry) {
      const text = h("span", {class: "notice-text"});
      const times = h("span", {class: "notice-times"});
      const el = h("div", {class: "notice", role: "alert", "data-key": key}, text, times,
        h("button", {type: "button", class: "dismiss", title: "Dismiss", onclick: () => resolve(key)}, "×"));
      entry = {el, text, times, count: 0, keep, since: new Date()};
      shown.set(key, entry);
      container.append(el);
    }
    entry.count += 1;
    entry.keep = entry.keep || keep;
    entry.text.textContent = message;
    entry.times.textContent = entry.count > 1 ? " (" + entry.count + " times)" : "";
    entry.el.title = "First at " + entry.since.toLocaleTimeString() + ", last at " + new Date().toLocaleTimeString();
  }

  /** The failure keyed `key` is over: its notice goes. */
  function resolve(key) {
    const entry = shown.get(key);
    if (!entry) return;
    entry.el.remove();
    shown.delete(key);
  }

  /** On navigation: the notices of the page left behind go. */
  function leavePage() {
    for (const [key, entry] of shown) if (!entry.keep) resolve(key);
  }

  /**
   * Script errors and rejected promises nobody handled are shown too (the browser still logs
   * them to its console). A request's failure that reached here keeps its own key and text.
   */
  function catchUncaught(target) {
    target.addEventListener("error", (e) => {
      const where = e.filename ? " (" + e.filename.replace(location.origin, "") + ":" + e.lineno + ")" : "";
      show("Script error: " + e.message + where, {keep: true});
    });
    target.addEventListener("unhandledrejection", (e) => {
      const reason = e.reason;
      if (reason && reason.name === "RequestFailed") show(reason);
      else show("Script error: " + (reason && reason.message ? reason.message : String(reason)), {keep: true});
    });
  }

  return {show, resolve, leavePage, catchUncaught};
}
