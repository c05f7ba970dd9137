// The GraphQL page (`/v1/graphiql`): a query editor that completes field names from the schema,
// a schema explorer, and the answer. The schema is read once per page with an introspection
// query; everything is this file's own (no library, no inline script).

import {card, fill, h} from "../dom.js";
import {storedToken} from "../token.js";

const ENDPOINT = "/v1/graphql";

const INTROSPECTION = `query Schema {
  __schema {
    queryType { name } mutationType { name } subscriptionType { name }
    types {
      kind name description
      fields(includeDeprecated: true) {
        name description
        args { name description defaultValue type { ...Ref } }
        type { ...Ref }
      }
      inputFields { name description defaultValue type { ...Ref } }
      enumValues(includeDeprecated: true) { name description }
    }
  }
}
fragment Ref on __Type { kind name ofType { kind name ofType { kind name ofType { kind name } } } }`;

const START = "{\n  status {\n    version\n    \n  }\n}\n";

/** `[Type!]!` for a type reference of the introspection. */
export function typeName(ref) {
  if (!ref) return "?";
  if (ref.kind === "NON_NULL") return typeName(ref.ofType) + "!";
  if (ref.kind === "LIST") return "[" + typeName(ref.ofType) + "]";
  return ref.name;
}

/** The named type under lists and non-nulls. */
function namedType(ref) {
  while (ref && ref.ofType) ref = ref.ofType;
  return ref ? ref.name : null;
}

/**
 * The type whose fields may be written at the end of `before` (the text up to the cursor), and
 * the name being typed there: {type, prefix}, or null outside a selection set (in arguments, a
 * string or a comment, or before the first `{`).
 */
export function completionContext(schema, before) {
  // Strings and comments hold no fields.
  const code = before.replace(/"(?:[^"\\\n]|\\.)*"/g, '""').replace(/#[^\n]*/g, "");
  if (/"[^"\n]*$/.test(code)) return null;
  const prefix = (code.match(/[_A-Za-z][_0-9A-Za-z]*$/) || [""])[0];
  const tokens = code.slice(0, code.length - prefix.length).match(/\.\.\.|[_A-Za-z][_0-9A-Za-z]*|[{}():$@!=[\],]/g) || [];
  const stack = [];
  let parens = 0;
  let operation = null;   // "query", "mutation", "subscription" or a fragment's type
  let lastField = null;
  let onType = null;
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i];
    if (t === "(") { parens++; continue; }
    if (t === ")") { parens = Math.max(0, parens - 1); continue; }
    if (parens > 0) continue;
    if (t === "{") {
      if (!stack.length) {
        const root = operation && schema.byName[operation] ? operation
          : schema.roots[operation || "query"];
        stack.push(root || null);
      } else if (onType) {
        stack.push(onType);
      } else {
        const parent = schema.byName[stack[stack.length - 1]];
        const field = parent && (parent.fields || []).find((f) => f.name === lastField);
        stack.push(field ? namedType(field.type) : null);
      }
      onType = null;
      lastField = null;
    } else if (t === "}") {
      stack.pop();
      if (!stack.length) operation = null;
    } else if (/^[_A-Za-z]/.test(t)) {
      const previous = tokens[i - 1];
      if (!stack.length) {
        if (previous === "on") operation = t;
        else if (["query", "mutation", "subscription"].includes(t) && !operation) operation = t;
      } else if (previous === "on") {
        onType = t;
      } else if (t !== "on" && previous !== "$" && previous !== "@") {
        lastField = t;
      }
    }
  }
  if (parens > 0 || !stack.length || !stack[stack.length - 1]) return null;
  return {type: stack[stack.length - 1], prefix};
}

/** The fields of `type` that start with `prefix` (ignoring case), `__typename` last. */
export function completions(schema, context) {
  const type = schema.byName[context.type];
  const fields = (type && type.fields) || [];
  const lower = context.prefix.toLowerCase();
  return fields.map((f) => ({name: f.name, type: typeName(f.type), object: isComposite(schema, f.type)}))
    .concat([{name: "__typename", type: "String!", object: false}])
    .filter((f) => f.name.toLowerCase().startsWith(lower) && f.name !== context.prefix);
}

function isComposite(schema, ref) {
  const t = schema.byName[namedType(ref)];
  return !!t && ["OBJECT", "INTERFACE", "UNION"].includes(t.kind);
}

/** The introspection answer made easy to look up: {roots, byName, types}. */
function indexSchema(raw) {
  const byName = {};
  for (const t of raw.types) byName[t.name] = t;
  const name = (r) => r && r.name;
  return {
    roots: {query: name(raw.queryType), mutation: name(raw.mutationType), subscription: name(raw.subscriptionType)},
    byName,
    types: raw.types.filter((t) => !t.name.startsWith("__")).sort((a, b) => a.name.localeCompare(b.name)),
  };
}

export function graphqlPage(ctx) {
  let schema = null;
  const query = h("textarea", {id: "gql-query", class: "gql-editor", spellcheck: "false",
    "aria-label": "Query", autocomplete: "off"});
  query.value = START;
  const popup = h("ul", {id: "gql-complete", class: "gql-complete", role: "listbox", hidden: true});
  const variables = h("textarea", {id: "gql-variables", class: "gql-variables", spellcheck: "false",
    placeholder: "Variables (JSON)", "aria-label": "Variables"});
  const result = h("pre", {id: "gql-result", class: "gql-result"});
  const explorer = h("div", {id: "gql-explorer", class: "gql-explorer"}, h("p", {class: "muted"}, "Loading the schema…"));
  const run = h("button", {id: "gql-run", type: "button", onclick: execute}, "Run");
  const subscribe = h("button", {id: "gql-subscribe", type: "button", onclick: toggleSubscription}, "Subscribe");
  const socketState = h("span", {id: "gql-socket", class: "muted"});
  let socket = null;
  let offered = [];
  let chosen = 0;
  const history = [];

  /** The request of the editor: {query, variables}, or null (and why, shown) when the variables are not JSON. */
  function request() {
    let vars = null;
    if (variables.value.trim()) {
      try {
        vars = JSON.parse(variables.value);
      } catch (e) {
        result.textContent = "Variables are not JSON: " + e.message;
        return null;
      }
    }
    return {query: query.value, variables: vars};
  }

  function stopSubscription() {
    if (socket) socket.close();
    socket = null;
    subscribe.textContent = "Subscribe";
    socketState.textContent = "";
  }

  /** Subscribe runs the editor's operation over the WebSocket (graphql-transport-ws), showing each result; again stops it. */
  function toggleSubscription() {
    if (socket) return stopSubscription();
    const body = request();
    if (!body) return;
    const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + ENDPOINT,
      "graphql-transport-ws");
    socket = ws;
    let updates = 0;
    subscribe.textContent = "Stop";
    socketState.textContent = "connecting";
    // A browser sends no Authorization header on a WebSocket: the token goes in connection_init.
    const token = storedToken();
    ws.onopen = () => ws.send(JSON.stringify(token
      ? {type: "connection_init", payload: {Authorization: "Bearer " + token}} : {type: "connection_init"}));
    ws.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "connection_ack") {
        socketState.textContent = "subscribed";
        ws.send(JSON.stringify({id: "1", type: "subscribe", payload: body}));
      } else if (message.type === "next") {
        updates += 1;
        socketState.textContent = "update " + updates + " at " + new Date().toLocaleTimeString();
        result.textContent = JSON.stringify(message.payload, null, 2);
      } else if (message.type === "error") {
        result.textContent = JSON.stringify(message.payload, null, 2);
      } else if (message.type === "ping") {
        ws.send(JSON.stringify({type: "pong"}));
      }
    };
    ws.onclose = (event) => {
      if (socket !== ws) return;
      if (event.code === 4403) result.textContent = "This node needs its API token: run a query to be asked for it.";
      socketState.textContent = "closed" + (event.reason ? ": " + event.reason : "");
      socket = null;
      subscribe.textContent = "Subscribe";
    };
  }

  async function execute() {
    stopSubscription();
    const body = request();
    if (!body) return;
    result.textContent = "Running…";
    try {
      const answer = await ctx.api.postJson(ENDPOINT, body);
      result.textContent = JSON.stringify(answer.body, null, 2);
    } catch (e) {
      // A query that does not parse or validate is a 400 with the errors: show them here.
      result.textContent = e.detail || e.message;
    }
  }

  // ---- Completion ----
  function hidePopup() {
    offered = [];
    popup.hidden = true;
  }

  function showPopup(force) {
    if (!schema) return;
    const context = completionContext(schema, query.value.slice(0, query.selectionStart));
    if (!context || (!context.prefix && !force)) return hidePopup();
    offered = completions(schema, context);
    if (!offered.length) return hidePopup();
    chosen = 0;
    fill(popup, offered.map((f, i) => h("li", {role: "option", class: i === chosen ? "chosen" : null,
      dataset: {field: f.name},
      // mousedown, not click: the editor keeps its focus and cursor.
      onmousedown: (e) => { e.preventDefault(); accept(i); }},
      h("span", {class: "mono"}, f.name), " ", h("span", {class: "muted mono"}, f.type))));
    popup.hidden = false;
  }

  function mark() {
    popup.querySelectorAll("li").forEach((li, i) => li.classList.toggle("chosen", i === chosen));
    const li = popup.children[chosen];
    if (li && li.scrollIntoView) li.scrollIntoView({block: "nearest"});
  }

  function accept(i) {
    const field = offered[i];
    if (!field) return;
    const end = query.selectionStart;
    const before = query.value.slice(0, end);
    const prefix = (before.match(/[_A-Za-z][_0-9A-Za-z]*$/) || [""])[0];
    const insert = field.object ? field.name + " {  }" : field.name;
    query.setRangeText(insert, end - prefix.length, end, "end");
    if (field.object) query.selectionStart = query.selectionEnd = end - prefix.length + field.name.length + 3;
    hidePopup();
    query.focus();
  }

  query.addEventListener("input", () => showPopup(false));
  query.addEventListener("blur", hidePopup);
  query.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      hidePopup();
      execute();
    } else if (e.key === " " && e.ctrlKey) {
      e.preventDefault();
      showPopup(true);
    } else if (!popup.hidden) {
      if (e.key === "ArrowDown" || e.key === "ArrowUp") {
        e.preventDefault();
        chosen = (chosen + (e.key === "ArrowDown" ? 1 : offered.length - 1)) % offered.length;
        mark();
      } else if (e.key === "Enter" || e.key === "Tab") {
        e.preventDefault();
        accept(chosen);
      } else if (e.key === "Escape") {
        e.preventDefault();
        hidePopup();
      }
    }
  });

  // ---- The explorer ----
  function typeLink(ref) {
    const name = namedType(ref);
    return h("a", {href: "#", class: "gql-type mono", dataset: {type: name},
      onclick: (e) => { e.preventDefault(); open(name); }}, typeName(ref));
  }

  function describe(text) {
    return text ? h("div", {class: "gql-doc muted"}, text) : null;
  }

  function showRoots() {
    history.length = 0;
    const roots = Object.entries(schema.roots).filter(([, name]) => name);
    fill(explorer, h("h2", {}, "Schema"),
      h("ul", {class: "gql-fields", id: "gql-roots"}, roots.map(([kind, name]) =>
        h("li", {}, h("span", {class: "mono"}, kind + ": "), typeLink({name})))),
      h("h2", {}, "All types"),
      h("ul", {class: "gql-fields", id: "gql-types"}, schema.types.map((t) =>
        h("li", {}, typeLink({name: t.name}), " ", h("span", {class: "muted"}, t.kind.toLowerCase())))));
  }

  function open(name, back) {
    const t = schema.byName[name];
    if (!t) return;
    if (!back) history.push(name);
    const fields = t.fields || t.inputFields || [];
    fill(explorer,
      h("div", {class: "gql-crumbs"},
        h("a", {href: "#", id: "gql-back", onclick: (e) => {
          e.preventDefault();
          history.pop();
          if (history.length) open(history[history.length - 1], true); else showRoots();
        }}, "‹ Back"), " · ",
        h("a", {href: "#", onclick: (e) => { e.preventDefault(); showRoots(); }}, "Schema")),
      h("h2", {id: "gql-type-name"}, h("span", {class: "mono"}, t.name), " ",
        h("span", {class: "muted"}, t.kind.toLowerCase())),
      describe(t.description),
      fields.length ? h("ul", {class: "gql-fields", id: "gql-type-fields"}, fields.map((f) =>
        h("li", {dataset: {field: f.name}},
          h("span", {class: "mono gql-field"}, f.name),
          f.args && f.args.length ? ["(", f.args.map((a, i) => [i ? ", " : "", h("span", {class: "mono"}, a.name + ": "),
            typeLink(a.type), a.defaultValue != null ? h("span", {class: "mono muted"}, " = " + a.defaultValue) : null]), ")"] : null,
          ": ", typeLink(f.type),
          describe(f.description),
          (f.args || []).filter((a) => a.description).map((a) =>
            h("div", {class: "gql-doc muted"}, h("span", {class: "mono"}, a.name), ": " + a.description))))) : null,
      t.enumValues && t.enumValues.length ? h("ul", {class: "gql-fields"}, t.enumValues.map((v) =>
        h("li", {}, h("span", {class: "mono"}, v.name), describe(v.description)))) : null);
  }

  async function loadSchema() {
    try {
      const answer = await ctx.api.postJson(ENDPOINT, {query: INTROSPECTION});
      schema = indexSchema(answer.body.data.__schema);
      showRoots();
    } catch (e) {
      fill(explorer, h("p", {class: "failed-here"}, "The schema could not be read: " + (e.detail || e.message)));
    }
  }
  loadSchema();

  return {leave: stopSubscription, node: h("div", {class: "gql-page"},
    h("h1", {}, "GraphQL"),
    h("div", {class: "gql-grid"},
      card(null,
        h("div", {class: "toolbar"}, run, subscribe, socketState,
          h("span", {class: "muted"}, " Ctrl+Enter runs · Ctrl+Space completes · POST " + ENDPOINT)),
        h("div", {class: "gql-editor-box"}, query, popup),
        variables,
        h("h2", {}, "Answer"), result),
      card(null, explorer)))};
}
