// The live status: `/v1/events` read as a stream of server-sent events, each carrying the whole
// `/v1/status`, and the fetches each new status makes necessary (schedule, peers, roles data).
//
// The stream is read with fetch rather than EventSource so that a refused stream (503 when the
// node serves its most streams) or a node that does not answer is shown with its cause; it is
// opened again by the same loop.

import {RequestFailed} from "./api.js";
import {showLive} from "./header.js";
import {deploymentKey} from "./state.js";

const EVENTS = "/v1/events";
/** Wait after a refused or broken stream: the node may be restarting or at its stream cap. */
const RETRY_MS = 3000;
/** Wait after the node ended a stream cleanly, so that one that ends every stream at once is not
 * asked in a tight loop. */
const REOPEN_MS = 500;
/** When a fetch a status asked for failed, it is tried again after this unless a new status
 * comes first. */
const REFETCH_MS = 5000;

const delay = (ms) => new Promise((done) => setTimeout(done, ms));

/** Follows the status for good; `redraw(previous)` runs after each status and its fetches. */
export function followStatus(ctx, redraw) {
  const {state, api, notices} = ctx;
  let refetch = null;

  /** Fetches what `status` made stale; false when some fetch failed (it is then shown). */
  async function refresh(status) {
    const jobs = [];
    const load = (what, key, path, keep) => {
      if (state.fetchedFor[what] === key) return;
      state.fetchedFor[what] = key;
      jobs.push(api.getJson(path).then((value) => {
        keep(value);
        return true;
      }, (error) => {
        state.fetchedFor[what] = undefined;   // asked again with the next status or the retry
        notices.show(error, {keep: true});
        return false;
      }));
    };
    if (status.schedule_id) {
      load("schedule", status.schedule_id, "/v1/schedule", (s) => { state.schedule = s; });
    } else {
      state.fetchedFor.schedule = null;
      state.schedule = null;
    }
    const peersKey = [status.peers, status.peers_timestamp, status.leader && status.leader.id,
      JSON.stringify(status.failing_nodes)].join("|");
    load("peers", peersKey, "/v1/peers", (p) => { state.peers = p; });
    if (status.schedule_id) {
      const rolesKey = [status.schedule_id, status.failed_roles.join(","),
        JSON.stringify(status.errors), deploymentKey(status)].join("|");
      load("roles", rolesKey, "/v1/roles_data", (r) => { state.rolesData = r; });
    }
    const done = await Promise.all(jobs);
    return done.every(Boolean);
  }

  async function onStatus(status) {
    clearTimeout(refetch);
    const previous = state.status;
    state.status = status;
    const complete = await refresh(status);
    redraw(previous);
    if (!complete) refetch = setTimeout(retry, REFETCH_MS);
  }

  async function retry() {
    if (!state.status) return;
    const complete = await refresh(state.status);
    // The data changed under an unchanged status: every page redraws as for a new one.
    redraw(null);
    if (!complete) refetch = setTimeout(retry, REFETCH_MS);
  }

  /** Reads the stream until `stop` is aborted, opening it again whenever it ends or fails. */
  async function run(stop) {
    while (!stop.signal.aborted) {
      try {
        const response = await api.stream(EVENTS, stop.signal);
        // "live" once a status came through this stream, not when it opens: until then the page
        // shows nothing current.
        let first = true;
        await readEvents(response, (event, data) => {
          if (event !== "status") return;
          const status = parseStatus(data);
          if (first) showLive(state, true);
          first = false;
          onStatus(status);
        });
        showLive(state, false);
        await delay(REOPEN_MS);
      } catch (e) {
        if (stop.signal.aborted) return;
        showLive(state, false);
        notices.show(e instanceof RequestFailed ? e
          : new RequestFailed("GET", EVENTS, 0, "the stream broke off (" + e.message + ")"), {keep: true});
        await delay(RETRY_MS);
      }
    }
  }

  // A page left for another is kept by the browser for Back (the back/forward cache), and its
  // open stream with it: each would hold one of the few connections a browser opens to a host,
  // until pages opened later cannot load. So the stream is closed when the page is hidden and
  // opened again when it is shown.
  let stop = new AbortController();
  window.addEventListener("pagehide", () => {
    stop.abort();
    showLive(state, false);
  });
  window.addEventListener("pageshow", (e) => {
    if (!e.persisted) return;
    stop = new AbortController();
    run(stop);
  });
  run(stop);
}

function parseStatus(data) {
  try {
    return JSON.parse(data);
  } catch (e) {
    throw new RequestFailed("GET", EVENTS, 200, "a status event is not JSON (" + e.message + ")");
  }
}

/** Reads server-sent events from `response` until it ends: `handle(event, data)` for each. */
async function readEvents(response, handle) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let carry = "";   // a CR at the end of a chunk, which may start a CRLF
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    const text = carry + value;
    carry = text.endsWith("\r") ? "\r" : "";
    buffer += (carry ? text.slice(0, -1) : text).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      dispatch(buffer.slice(0, end), handle);
      buffer = buffer.slice(end + 2);
    }
  }
}

/** One event block: `event:` and `data:` lines; comments (`:` lines, the keep-alive) are skipped. */
function dispatch(block, handle) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (data.length) handle(event, data.join("\n"));
}
