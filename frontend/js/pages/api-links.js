// The API page (`/api`): every route this node serves, from its route table (`/v1/routes`), with
// links to the ones a browser can open, and to the OpenAPI description.

import {card, failed, fill, h, table} from "../dom.js";

export function apiPage(ctx) {
  const {api, notices} = ctx;
  const docs = h("p", {},
    "Every route is described in ", h("a", {href: "/v1/openapi.yaml", id: "openapi-link"}, "the OpenAPI description"),
    " (docs/openapi.yaml, served by this node) and in docs/http-api.md. GraphQL: ",
    h("a", {href: "/v1/graphiql"}, "/v1/graphiql"), ".");
  const head = () => h("h1", {}, "API");
  const root = h("div", {}, head(), card(null, docs, h("p", {class: "muted"}, "Loading the route table…")));
  async function load() {
    try {
      const routes = await api.getJson("/v1/routes");
      fill(root, head(), card(null, docs, table(["Route", "Methods", "Open"], routes.map((r) => h("tr", {},
        h("td", {class: "mono"}, r.path), h("td", {class: "mono"}, r.methods.join(" ")),
        h("td", {}, opener(r)))), {id: "routes"})));
    } catch (e) {
      notices.show(e);
      fill(root, head(), card(null, docs, failed("Cannot load the route table", e)));
    }
  }
  load();
  return {node: root};
}

/** Links to a route a browser can open: a GET without placeholders, its `.pretty` form too. */
function opener(route) {
  if (!route.methods.includes("GET") || route.path.includes("{")) return null;
  const a = (href, text) => h("a", {href}, text);
  if (route.formats) return [a(route.path, "json"), " · ", a(route.path + ".pretty", "pretty")];
  return a(route.path, route.path === "/v1/events" ? "event stream" : "open");
}
