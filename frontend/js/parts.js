// Pieces of pages that read the state: links to nodes and the names of schedule origins.

import {h, short} from "./dom.js";
import {nodeByHostname} from "./state.js";

/** A node's host name, linking to its frontend when it is another node with an address. */
export function nodeLink(state, hostname) {
  const node = nodeByHostname(state, hostname);
  if (!node || node.self || !node.addr) return h("span", {}, hostname);
  return h("a", {href: "http://" + node.addr + "/", title: node.name}, hostname);
}

/** The name of the node that made a schedule (its id when it is no known node). */
export function originName(state, origin) {
  const s = state.status;
  if (s && origin === s.id) return s.name;
  const peer = state.peers.find((p) => p.id === origin);
  return peer ? peer.name : h("span", {class: "mono"}, short(origin));
}
