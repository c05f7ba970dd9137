// The API token (`http.token-file` on the node): asked for when a request is refused with 401,
// kept in the browser session (sessionStorage: this tab, until it is closed; reloads keep it)
// and sent with every request as `Authorization: Bearer`. The form is a small part of the page
// (not window.prompt): one form however many requests wait for it, and the reason of the last
// 401 above its field.

import {h} from "./dom.js";

const KEY = "verwalter-api-token";

function read() {
  try {
    return sessionStorage.getItem(KEY);
  } catch (e) {
    return null;   // storage turned off: the token lives as long as the page
  }
}

function write(token) {
  try {
    if (token === null) sessionStorage.removeItem(KEY);
    else sessionStorage.setItem(KEY, token);
  } catch (e) {
    // storage turned off: kept in memory below
  }
}

/** The token kept for this tab (for what cannot go through the API's requests: a WebSocket). */
export function storedToken() {
  return read();
}

/** The token of this session, and the form that asks for it in `container`. */
export function createTokens(container) {
  let memory = read();
  let asking = null;   // the promise of the form shown now, shared by every request waiting

  function current() {
    return read() || memory;
  }

  function forget() {
    memory = null;
    write(null);
  }

  /** Shows the form with `why`; resolves to the token entered, or null when cancelled. */
  function ask(why) {
    if (asking) {
      asking.reason(why);
      return asking.promise;
    }
    let done;
    const promise = new Promise((resolve) => { done = resolve; });
    const reason = h("p", {class: "token-reason"}, why);
    const input = h("input", {type: "password", id: "token-input", name: "token",
      autocomplete: "off", spellcheck: "false", required: true, "aria-label": "API token"});
    const finish = (token) => {
      form.remove();
      asking = null;
      if (token) {
        memory = token;
        write(token);
      }
      done(token);
    };
    const form = h("form", {id: "token-form", class: "token-form",
      onsubmit: (e) => {
        e.preventDefault();
        const token = input.value.trim();
        if (token) finish(token);
      }},
      h("strong", {}, "This node asks for its API token"), reason,
      h("label", {}, "Token ", input),
      h("button", {type: "submit", class: "primary"}, "Send"),
      h("button", {type: "button", onclick: () => finish(null)}, "Cancel"),
      h("p", {class: "muted"}, "Kept in this browser tab until it is closed; the operator of the " +
        "node has it in the file named by http.token-file."));
    container.append(form);
    input.focus();
    asking = {promise, reason: (text) => { reason.textContent = text; }};
    return promise;
  }

  return {current, forget, ask};
}
