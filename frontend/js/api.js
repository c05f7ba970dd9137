// Requests to the node's own HTTP API. Every failure (no answer, an HTTP error, an answer that is
// not the JSON it should be) becomes a RequestFailed that says what was asked and why it failed,
// with the node's own `error` text when it sent one. Nothing is dropped here: callers show the
// error, as a notice (notices.js) or on the line under the button the operator pressed, and a
// request that succeeds again clears its notice.
//
// A node with an API token (http.token-file) answers 401 to requests without it: the request
// then waits for the token form (token.js), is sent again with the token, and every later request
// carries it. A token the node refuses is forgotten, the 401 is shown as a notice, and the form
// asks again.

export class RequestFailed extends Error {
  /**
   * `status` is the HTTP status, 0 when the node did not answer; `detail` is the cause in
   * words. The notice of a request is keyed by `key` (method and path, without the query).
   */
  constructor(method, path, status, detail) {
    super(what(method, path) + ": " + detail);
    this.name = "RequestFailed";
    this.key = keyOf(method, path);
    this.status = status;
    this.detail = detail;
  }
}

function what(method, path) {
  switch (method) {
    case "GET": return "Could not load " + path;
    case "HEAD": return "Could not read " + path;
    default: return "Could not send " + method + " " + path;
  }
}

function keyOf(method, path) {
  return method + " " + path.split("?")[0];
}

/** `error` of a JSON error body, or null when the text is not one. */
function errorField(text) {
  try {
    const body = JSON.parse(text);
    return body && typeof body.error === "string" ? body.error : null;
  } catch (e) {
    return null;   // not JSON: the caller shows the text as it is
  }
}

/** "503 Service Unavailable: <what the node said>" for a response that is not a success. */
async function reason(response) {
  const head = response.status + (response.statusText ? " " + response.statusText : "");
  let text;
  try {
    text = await response.text();
  } catch (e) {
    return head + " (the answer broke off: " + e.message + ")";
  }
  const said = errorField(text) || text.trim().slice(0, 300);
  return said ? head + ": " + said : head;
}

/**
 * The API of one page; `notices` is told when a request succeeds, to clear its notice; `tokens`
 * (token.js) holds the API token and asks for it.
 */
export function createApi(notices, tokens) {
  /** One request; resolves to the response when it is a success (2xx), else throws. */
  async function send(method, path, init) {
    for (;;) {
      const token = tokens.current();
      const headers = new Headers(init.headers || {});
      if (token) headers.set("Authorization", "Bearer " + token);
      let response;
      try {
        response = await fetch(path, {...init, headers, method});
      } catch (e) {
        throw new RequestFailed(method, path, 0, "the node did not answer (" + e.message + ")");
      }
      if (response.status !== 401) {
        if (!response.ok) throw new RequestFailed(method, path, response.status, await reason(response));
        return response;
      }
      const refused = new RequestFailed(method, path, 401, await reason(response));
      // Another request got a token meanwhile: try that one first.
      if (tokens.current() !== token) continue;
      if (token) {
        tokens.forget();
        notices.show(refused);
      }
      if (!await tokens.ask(refused.message)) throw refused;
    }
  }

  async function body(method, path, response, read) {
    try {
      return await read(response);
    } catch (e) {
      throw new RequestFailed(method, path, response.status, "the answer could not be read (" + e.message + ")");
    }
  }

  function succeeded(method, path) {
    notices.resolve(keyOf(method, path));
  }

  return {
    /** GET `path` as JSON. */
    async getJson(path) {
      const response = await send("GET", path, {headers: {Accept: "application/json"}});
      const value = await body("GET", path, response, (r) => r.json());
      succeeded("GET", path);
      return value;
    },

    /** GET `path` as text: {text, response} (for its status and headers, e.g. Content-Range). */
    async getText(path, init) {
      const response = await send("GET", path, init || {});
      const text = await body("GET", path, response, (r) => r.text());
      succeeded("GET", path);
      return {text, response};
    },

    /** GET `path` as bytes: {bytes, response} (offsets into log files are in bytes). */
    async getBytes(path, init) {
      const response = await send("GET", path, init || {});
      const bytes = await body("GET", path, response, async (r) => new Uint8Array(await r.arrayBuffer()));
      succeeded("GET", path);
      return {bytes, response};
    },

    /** HEAD `path`: the response, for its headers. */
    async head(path, init) {
      const response = await send("HEAD", path, init || {});
      succeeded("HEAD", path);
      return response;
    },

    /** POST `value` as JSON: {status, body}; `body` is null for a 204. */
    async postJson(path, value) {
      const response = await send("POST", path, {
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify(value),
      });
      const answer = response.status === 204 ? null : await body("POST", path, response, (r) => r.json());
      succeeded("POST", path);
      return {status: response.status, body: answer};
    },

    /** POST without a body: the response. */
    async post(path) {
      const response = await send("POST", path, {});
      succeeded("POST", path);
      return response;
    },

    /** GET a stream (`/v1/events`): the response, its body still to be read until `signal`. */
    async stream(path, signal) {
      const response = await send("GET", path, {headers: {Accept: "text/event-stream"}, cache: "no-store", signal});
      succeeded("GET", path);
      return response;
    },
  };
}
