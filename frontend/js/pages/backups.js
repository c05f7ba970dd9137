// The Backups page (`/backups`): the schedule backups this node keeps.

import {card, failed, fill, h, table} from "../dom.js";

export function backupsPage(ctx) {
  const {api, notices} = ctx;
  const head = () => h("h1", {}, "Schedule backups");
  const root = h("div", {}, head(), card(null, h("p", {class: "muted"}, "Loading…")));
  async function load() {
    try {
      const names = await api.getJson("/v1/backups");
      fill(root, head(), card(null,
        names.length ? table(["Backup", "Kind"], names.slice().reverse().map((n) => h("tr", {},
          h("td", {}, h("a", {href: "/v1/backup/" + encodeURIComponent(n)}, n)),
          h("td", {class: "muted"}, n.split("-")[0]))), {id: "backups"})
          : h("p", {class: "muted"}, "No backups yet: one is made with each new schedule, per hour, day and week."),
        h("p", {class: "muted"}, "Each is the gzipped schedule.json of its period; browsers show it unpacked.")));
    } catch (e) {
      notices.show(e);
      fill(root, head(), card(null, failed("Cannot list backups", e)));
    }
  }
  load();
  return {node: root};
}
