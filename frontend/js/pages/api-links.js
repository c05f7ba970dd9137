// The API page (`/api`): links to the routes the frontend is made of.

import {card, h, table} from "../dom.js";

const JSON_ROUTES = ["status", "peers", "schedule", "scheduler_input", "election", "pending_actions",
  "roles_data", "backups"];

export function apiPage() {
  const row = (route, ...links) => h("tr", {}, h("td", {class: "mono"}, route), h("td", {}, ...links));
  return {node: h("div", {}, h("h1", {}, "API"), card(null,
    table(["Route", "Formats"], JSON_ROUTES.map((n) => row("/v1/" + n,
      h("a", {href: "/v1/" + n}, "json"), " · ", h("a", {href: "/v1/" + n + ".pretty"}, "pretty"))).concat([
      row("/v1/scheduler_debug_info", h("a", {href: "/v1/scheduler_debug_info"}, "text")),
      row("/v1/events", h("a", {href: "/v1/events"}, "event stream")),
      row("/metrics", h("a", {href: "/metrics"}, "Prometheus")),
    ])),
    h("p", {class: "muted"}, "Every route is described in docs/openapi.yaml and docs/http-api.md.")))};
}
