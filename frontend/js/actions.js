// The buttons the schedule declares, and the re-render button: what they send and where the
// answer (or the reason it was refused) appears, on a line under the buttons.

import {h} from "./dom.js";
import {isLeader, leaderUrl} from "./state.js";

export function describe(action) {
  const b = action.button || {};
  return [b.role, b.action, b.version, b.daemon && "daemon " + b.daemon, b.host && "on " + b.host]
    .filter(Boolean).join(" ");
}

/** Sends an action to the leader and shows what became of it in `results`. */
async function press(ctx, button, action, confirmText, results) {
  if (confirmText && !window.confirm(confirmText === true ? "Are you sure?" : confirmText)) return;
  const line = h("div", {class: "result pending"}, "Sent " + describe(action) + "…");
  results.prepend(line);
  button.disabled = true;
  try {
    const {status, body} = await ctx.api.postJson("/v1/wait_action", action);
    if (status === 204) {
      line.className = "result ok";
      line.textContent = describe(action) + ": done, the schedule took it";
    } else {
      const bad = body && typeof body === "object" && body.error;
      line.className = "result " + (bad ? "bad" : "ok");
      line.textContent = describe(action) + ": " +
        (bad ? body.error : (body && body.ok) || JSON.stringify(body));
    }
  } catch (e) {
    // Refused (a limit, a follower, a timeout) or no answer: the request and the node's reason.
    line.className = "result bad";
    line.textContent = describe(action) + ": " + e.message;
  } finally {
    button.disabled = false;
  }
}

/** A button sending `action`; disabled with a pointer to the leader on other nodes. */
export function actionButton(ctx, title, action, confirmText, results) {
  const button = h("button", {type: "button", "data-action": action.button.action,
    "data-version": action.button.version, title: describe(action)}, title);
  if (!isLeader(ctx.state)) {
    button.disabled = true;
    button.title = "Actions are taken by the leader only";
  }
  button.addEventListener("click", () => press(ctx, button, action, confirmText, results));
  return button;
}

/** On a follower: where the buttons work. */
export function leaderNotice(state) {
  if (isLeader(state)) return null;
  const url = leaderUrl(state, location.pathname + location.search);
  return h("div", {class: "banner warn", id: "leader-notice"}, "Actions are taken by the leader only. ",
    url ? h("a", {href: url}, "Open this page on the leader (" + state.status.leader.name + ")")
      : "No leader is known right now.");
}

/** The `Re-render all roles` button, answering on a line in `results`. */
export function forceRenderButton(ctx, results) {
  const button = h("button", {type: "button", id: "force-render"}, "Re-render all roles");
  button.addEventListener("click", async () => {
    button.disabled = true;
    const line = h("div", {class: "result pending"}, "Re-rendering every role of this node…");
    results.prepend(line);
    try {
      await ctx.api.post("/v1/force_render_all");
      line.className = "result ok";
      line.textContent = "Every role of this node is rendered again (see Logs).";
    } catch (e) {
      line.className = "result bad";
      line.textContent = "Re-render: " + e.message;
    } finally {
      button.disabled = false;
    }
  });
  return button;
}
