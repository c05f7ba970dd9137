// The deployment log's index, as the Logs and role pages read it, and the tail page of an entry.

/** How much of the index is read: its last MiB, as 0.13 read it. */
const INDEX_TAIL = 1048576;

/**
 * The newest index entries, newest first: {entries, unreadable}. `unreadable` counts lines that
 * are not index lines (the last line may be one being written: it is not counted).
 */
export async function loadIndex(api) {
  const {text: raw, response} = await api.getText("/v1/log/index/latest",
    {headers: {Range: "bytes=-" + INDEX_TAIL}});
  let text = raw;
  // A range that starts mid-file starts mid-line: drop the partial line.
  const range = response.headers.get("Content-Range");
  if (response.status === 206 && range && !/^bytes 0-/.test(range)) text = text.slice(text.indexOf("\n") + 1);
  const lines = text.split("\n").filter((line) => line.trim());
  const entries = [];
  let unreadable = 0;
  lines.forEach((line, i) => {
    const entry = parseLine(line);
    if (entry) entries.push(entry);
    else if (i < lines.length - 1 || text.endsWith("\n")) unreadable += 1;
  });
  return {entries: entries.reverse(), unreadable};
}

/** One index line, `[time, deployment, pointer, marker]`; null when it is not one. */
function parseLine(line) {
  let fields;
  try {
    fields = JSON.parse(line);
  } catch (e) {
    return null;
  }
  if (!Array.isArray(fields)) return null;
  const [time, deployment, pointer, marker] = fields;
  const values = (pointer && pointer.fields) || [];
  return {time, ms: Date.parse(time), deployment, kind: pointer && pointer.variant, fields: values,
    marker: typeof marker === "string" ? marker : marker && marker.variant,
    detail: marker && marker.fields ? marker.fields.join(" ") : "",
    role: pointer && pointer.variant === "Role" ? values[0] : null};
}

/** The tail page of an index entry's file, at its offset. */
export function tailPath(e) {
  const f = e.fields;
  switch (e.kind) {
    case "Role": return "/tail/role/" + encodeURIComponent(f[0]) + "/log." + f[1] + ".txt?offset=" + f[2];
    case "Global": return "/tail/global/log." + f[0] + ".txt?offset=" + f[1];
    case "Changes": return "/tail/changes/log." + f[0] + ".txt?offset=" + f[1];
    case "External": return "/tail/external/" + f[0].split("/").map(encodeURIComponent).join("/");
    default: return "/logs";
  }
}

/** The log file (under /v1/log/) an index entry points into, or null (external logs). */
function filePath(e) {
  const f = e.fields;
  switch (e.kind) {
    case "Role": return "/v1/log/role/" + encodeURIComponent(f[0]) + "/log." + f[1] + ".txt";
    case "Global": return "/v1/log/global/log." + f[0] + ".txt";
    case "Changes": return "/v1/log/changes/log." + f[0] + ".txt";
    default: return null;
  }
}

/** Byte offset of an entry's marker line in its file. */
function offsetOf(e) {
  return e.kind === "Role" ? e.fields[2] : e.fields[1];
}

/** A marker line in a log segment: `<time> <id> ------------ <what> -----------`. */
const MARKER_LINE = /^\S+ \S+ -{12} .* -{11}$/;

/**
 * What follows each entry's marker line in its file, up to the next marker line: a role's
 * `result: ok` after its RoleFinish, `all roles applied` or `failed roles: ...` after a
 * DeploymentFinish, `schedule-hash: ...` after a DeploymentStart. One request per file, for its
 * last MiB (an entry before that gets no text). Returns a Map from entry to text.
 */
export async function textsAfter(api, entries) {
  const files = new Map();
  for (const e of entries) {
    const path = filePath(e);
    if (!path) continue;
    if (!files.has(path)) files.set(path, []);
    files.get(path).push(e);
  }
  const out = new Map();
  await Promise.all([...files].map(async ([path, list]) => {
    const {bytes, response} = await api.getBytes(path, {headers: {Range: "bytes=-" + INDEX_TAIL}});
    // Where the bytes start in the file: the range's start, or 0 for the whole file.
    const range = /^bytes (\d+)-/.exec(response.headers.get("Content-Range") || "");
    const start = response.status === 206 && range ? Number(range[1]) : 0;
    const decoder = new TextDecoder();
    for (const e of list) {
      const at = offsetOf(e) - start;
      if (at < 0 || at >= bytes.length) continue;
      const lines = decoder.decode(bytes.subarray(at, Math.min(bytes.length, at + 4096))).split("\n").slice(1);
      const end = lines.findIndex((line) => MARKER_LINE.test(line));
      out.set(e, lines.slice(0, end < 0 ? lines.length : end).join("\n").trim());
    }
  }));
  return out;
}
