// The built-in web frontend: one page that routes itself, kept live by the /v1/events stream.
//
// Native ES modules, served as they are (no build step, no framework): this file wires them.
// js/dom.js builds elements, js/api.js asks the node (with the API token of js/token.js when
// the node asks for one), js/notices.js shows what failed,
// js/state.js holds what the node said, js/stream.js follows the status, js/header.js draws the
// header, js/router.js picks the page from js/pages/. Docs: docs/frontend.md.

import {createApi} from "./js/api.js";
import {tickAges} from "./js/dom.js";
import {renderHeader} from "./js/header.js";
import {createNotices} from "./js/notices.js";
import {createRouter} from "./js/router.js";
import {createState} from "./js/state.js";
import {followStatus} from "./js/stream.js";
import {createTokens} from "./js/token.js";

/** Ages ("12 s ago") move on this often without a status change. */
const AGE_TICK_MS = 1000;

const notices = createNotices(document.getElementById("notices"));
notices.catchUncaught(window);
const tokens = createTokens(document.getElementById("token-prompt"));
const ctx = {state: createState(), notices, api: createApi(notices, tokens)};
const router = createRouter(ctx, document.getElementById("page"));

router.show();
followStatus(ctx, (previous) => {
  renderHeader(ctx.state);
  router.live(previous);
});
setInterval(tickAges, AGE_TICK_MS);
