// The Scheduler log page (`/scheduler`): the log of the scheduler's last run on this node.

import {card, failed, fill, h, kv} from "../dom.js";
import {isLeader, leaderUrl} from "../state.js";

export function schedulerPage(ctx) {
  const {state, api, notices} = ctx;
  const root = h("div", {});
  let drawnFor;
  async function draw() {
    const s = state.status;
    if (!s) return;
    const key = [s.schedule_id, s.metrics.scheduler_succeeded, s.metrics.scheduler_failed, isLeader(state)].join("|");
    if (key === drawnFor) return;
    drawnFor = key;
    const head = h("h1", {}, "Scheduler log");
    const runs = s.metrics.scheduler_succeeded + s.metrics.scheduler_failed;
    if (!runs) {
      const url = leaderUrl(state, "/scheduler");
      fill(root, head, card(null, h("p", {}, "The scheduler has not run on this node: only the leader runs it. ",
        url ? h("a", {href: url}, "Open it on the leader (" + s.leader.name + ")") : null)));
      return;
    }
    let log;
    try {
      log = h("pre", {class: "log", id: "scheduler-log"}, (await api.getText("/v1/scheduler_debug_info")).text);
    } catch (e) {
      drawnFor = undefined;   // asked again with the next status
      notices.show(e);
      log = failed("No scheduler log", e);
    }
    const error = s.errors.scheduler || s.errors.scheduler_load;
    fill(root, head,
      error ? h("div", {class: "banner bad"}, h("strong", {}, "The last run failed: "), h("pre", {}, error)) : null,
      card(null, kv([["runs", s.metrics.scheduler_succeeded + " ok, " + s.metrics.scheduler_failed + " failed"]]),
        h("p", {}, h("a", {href: "/v1/scheduler_input.pretty"}, "input of the last run"), " · ",
          h("a", {href: "/v1/scheduler_debug_info"}, "raw"))),
      log);
  }
  draw();
  return {node: root, live: draw};
}
