//! A schedule's `data`, held as its canonical JSON and parsed into a tree only when read whole.
//!
//! Every node takes every schedule the leader makes, and schedules of a fleet run to megabytes.
//! Parsing one into a [`Value`] tree, writing its canonical form again to check the hash and
//! freeing the old tree cost a node more CPU than everything else it does per change. Most nodes
//! never read the whole tree: they store the schedule, serve it to peers and render their own
//! roles from `vars`, `roles`, `changes` and their own entry in `nodes`. So a schedule's data is
//! kept as the canonical text its hash covers; the storage dir and `/v1/schedule` write that text
//! as it is, [`ScheduleData::node_view`] reads one node's part by scanning it, and
//! [`ScheduleData::tree`] parses the whole once for the readers that need it (the scheduler's
//! `parents` on a new leader, `full_schedule` in templates, the API's schedule queries).
//!
//! Text that arrives from a peer or the disk is taken as canonical without being rewritten when
//! its SHA-1 is the hash it came with (the leader hashed exactly these bytes); otherwise (a peer
//! that formats differently, a file edited by hand) it is parsed and written canonically, and
//! [`crate::state::Schedule::verify`] then compares hashes as before. Either way only text that
//! parses into a tree is kept, so [`ScheduleData::tree`] cannot fail.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::render::vars::json_text;
use crate::schedule::hash::{canonical_json, hash_canonical};

/// The keys of a schedule that a node's own view keeps besides its entry in `nodes`: what role
/// variables are made of ([`crate::render::vars`]) and the changes log the render controller reports.
pub(crate) const VIEW_KEYS: &[&str] = &["changes", "roles", "vars"];

/// A schedule's data: canonical JSON text, with its parsed tree made on first use. Cheap to
/// clone (shared).
#[derive(Clone)]
pub struct ScheduleData(Arc<Inner>);

struct Inner {
    /// Holds at `range` compact JSON with object keys sorted
    /// ([`crate::schedule::hash::write_canonical`]), or the exact text a schedule's hash was taken over:
    /// always one JSON value. (Text received in an envelope keeps the envelope around it rather
    /// than move a megabyte.)
    text: String,
    range: std::ops::Range<usize>,
    tree: OnceLock<Arc<Value>>,
    all_roles: OnceLock<BTreeSet<String>>,
    /// A node view cut when the text was checked ([`ScheduleData::received`]), and its host:
    /// the data the render controller renders from, made once and shared.
    view: Option<(String, ScheduleData)>,
    /// In such a view: where in `text` each entry of `roles` is (see [`ScheduleData::role_text`]).
    roles: BTreeMap<String, std::ops::Range<usize>>,
    /// In such a view, when a role's own variables hold values of [`UNPARSED_MIN`] bytes or
    /// more: the view's tree with each of them null, made instead of the tree (which is then
    /// parsed only when something asks for it); see [`ScheduleData::skeleton`].
    skeleton: Option<Arc<Value>>,
    /// The values left null in `skeleton`: by role, each key with where its text is in `text`
    /// and its tape (written by the arrival check's pass).
    unparsed: BTreeMap<String, Vec<Unparsed>>,
    /// The text is this node's canonical writing (the scheduler's output), so a node view is cut
    /// from it as from vouched-for text ([`ScheduleData::node_view_data`]).
    written_here: bool,
}

/// A value of a role's own variables at least this long (its canonical text) is left out of a
/// view's [`ScheduleData::skeleton`] and kept as text ([`TextPart`]): the render controller and
/// the role log read it as text, and it is parsed only for templates that may read it.
pub(crate) const UNPARSED_MIN: usize = 16 << 10;

/// A value left null in a view's skeleton: its key, where its text is in the view's text, and
/// its tape.
type Unparsed = (
    String,
    std::ops::Range<usize>,
    Arc<OnceLock<json_text::Tape>>,
);

/// One value of a schedule's data as its canonical JSON text: a part of the schedule's text,
/// shared (no copy). Checked JSON, so [`TextPart::parse`] cannot fail.
#[derive(Clone)]
pub struct TextPart {
    data: ScheduleData,
    range: std::ops::Range<usize>,
    /// Its structure, made on first use and shared by the clones (the role log keeps the last
    /// one logged, whose tape then serves the next comparison).
    tape: Arc<OnceLock<json_text::Tape>>,
}

impl TextPart {
    /// The value's canonical JSON text.
    pub fn text(&self) -> &str {
        &self.data.0.text[self.range.clone()]
    }

    /// The value's [`json_text::Tape`].
    pub(crate) fn tape(&self) -> &json_text::Tape {
        self.tape.get_or_init(|| json_text::tape(self.text()))
    }

    /// The value as a tree.
    pub fn parse(&self) -> Value {
        serde_json::from_str(self.text()).expect("schedule data is JSON")
    }
}

impl TextPart {
    /// `value`'s canonical text as a part of data of its own.
    pub fn of(value: &Value) -> TextPart {
        let text = String::from_utf8(canonical_json(value)).expect("serde_json writes UTF-8");
        let range = 0..text.len();
        TextPart {
            data: ScheduleData::with(text, OnceLock::new(), None),
            range,
            tape: Arc::default(),
        }
    }
}

impl std::fmt::Debug for TextPart {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "TextPart({} bytes)", self.range.len())
    }
}

impl PartialEq for TextPart {
    fn eq(&self, other: &TextPart) -> bool {
        self.text() == other.text()
    }
}

impl ScheduleData {
    fn with(
        text: String,
        tree: OnceLock<Arc<Value>>,
        view: Option<(String, ScheduleData)>,
    ) -> Self {
        let range = 0..text.len();
        ScheduleData::within(text, range, tree, view)
    }

    fn within(
        text: String,
        range: std::ops::Range<usize>,
        tree: OnceLock<Arc<Value>>,
        view: Option<(String, ScheduleData)>,
    ) -> Self {
        ScheduleData(Arc::new(Inner {
            text,
            range,
            tree,
            all_roles: OnceLock::new(),
            view,
            roles: BTreeMap::new(),
            skeleton: None,
            unparsed: BTreeMap::new(),
            written_here: false,
        }))
    }

    /// Marks data just made from text this version wrote canonically.
    fn written_here(mut self) -> Self {
        Arc::get_mut(&mut self.0)
            .expect("marked when made, before it is shared")
            .written_here = true;
        self
    }

    /// The tree the render controller reads a role's sources from: [`ScheduleData::tree`],
    /// except in a node view cut from vouched-for text where a role's own variables hold big
    /// values ([`UNPARSED_MIN`]; none of [`crate::render::vars::KEPT_PARSED`], none holding `$(`
    /// or a `\u` escape): there each of them is null, and their texts are
    /// [`ScheduleData::unparsed`]. Everything else in it is the tree's.
    pub(crate) fn skeleton(&self) -> &Value {
        match &self.0.skeleton {
            Some(skeleton) => skeleton,
            None => self.tree(),
        }
    }

    /// The values of `role`'s own variables that [`ScheduleData::skeleton`] leaves null, by key
    /// in key order, as text.
    pub(crate) fn unparsed(&self, role: &str) -> Vec<(String, TextPart)> {
        self.0.unparsed.get(role).map_or_else(Vec::new, |keys| {
            keys.iter()
                .map(|(key, range, tape)| {
                    let part = TextPart {
                        data: self.clone(),
                        range: range.clone(),
                        tape: tape.clone(),
                    };
                    (key.clone(), part)
                })
                .collect()
        })
    }

    /// The text of `roles[role]` in a node view cut from text its maker vouched for
    /// ([`ScheduleData::received_vouched`]), which is canonical as the whole was; `None` for
    /// other data. The render controller hashes
    /// a role's own variables from it instead of writing a big shared role out again.
    pub(crate) fn role_text(&self, role: &str) -> Option<&str> {
        let range = self.0.roles.get(role)?;
        self.0.text.get(range.clone())
    }

    /// Data made on this node (the scheduler's output): written canonically, its tree kept.
    pub fn from_value(value: Value) -> ScheduleData {
        ScheduleData::from_tree(Arc::new(value))
    }

    /// Data made on this node as canonical text by a writer that builds no tree (the Lua
    /// scheduler's converter): `text` must be what [`crate::schedule::hash::write_canonical`]
    /// writes for some JSON value (checked in debug builds). The tree is parsed on first use.
    pub fn from_canonical(text: String) -> ScheduleData {
        debug_assert!(
            serde_json::from_str::<Value>(&text)
                .is_ok_and(|tree| canonical_json(&tree) == text.as_bytes()),
            "not canonical JSON: {text:.200}"
        );
        ScheduleData::with(text, OnceLock::new(), None).written_here()
    }

    /// Like [`ScheduleData::from_value`], sharing a tree the caller holds.
    pub(crate) fn from_tree(tree: Arc<Value>) -> ScheduleData {
        let text = String::from_utf8(canonical_json(&tree)).expect("serde_json writes UTF-8");
        ScheduleData::with(text, OnceLock::from(tree), None).written_here()
    }

    /// Data received as JSON text `raw` with the hash `claimed` for it (read from the storage
    /// dir, or from a peer that wrote it in another form than this version's). It is parsed,
    /// which checks it the way every schedule was checked before; text whose SHA-1 is `claimed`
    /// is then kept as it is, other text written canonically (its hash is then checked by the
    /// caller).
    pub(crate) fn from_raw(
        raw: Box<RawValue>,
        claimed: &str,
    ) -> Result<ScheduleData, serde_json::Error> {
        let tree: Value = serde_json::from_str(raw.get())?;
        if hash_canonical(raw.get().as_bytes()) == claimed {
            return Ok(ScheduleData::with(
                String::from(Box::<str>::from(raw)),
                OnceLock::from(Arc::new(tree)),
                None,
            ));
        }
        Ok(ScheduleData::from_value(tree))
    }

    /// Data received as the JSON text `data` with the hash `claimed` for it, read the way
    /// [`ScheduleData::from_raw`] reads it, but hashed as it came, whitespace around the value
    /// included: text whose exact bytes hash to `claimed` is kept as it is, whatever the value
    /// (the one-pass reading takes only objects; this is the rest of that reading).
    pub(crate) fn from_text(data: &str, claimed: &str) -> Result<ScheduleData, serde_json::Error> {
        let tree: Value = serde_json::from_str(data)?;
        if hash_canonical(data.as_bytes()) == claimed {
            return Ok(ScheduleData::with(
                data.to_string(),
                OnceLock::from(Arc::new(tree)),
                None,
            ));
        }
        Ok(ScheduleData::from_value(tree))
    }

    /// Text received at `range` of `text` for a schedule of hash `claimed` that nothing has
    /// checked to be JSON yet, as a node that renders as `host` takes it from a peer (the rest
    /// of `text` is its envelope, kept as well). Taken as it is when its SHA-1 is `claimed`
    /// and it is a JSON object that serde_json would parse, checked in the one pass that finds
    /// `host`'s view ([`scan::cut`]; the view is kept for the render controller): a schedule
    /// of a megabyte is read once, no tree built. Otherwise the text comes back, for the caller
    /// to read the slow way, which explains what is wrong ([`ScheduleData::from_raw`],
    /// [`crate::state::Schedule::verify`]).
    pub(crate) fn received(
        text: String,
        range: std::ops::Range<usize>,
        claimed: &str,
        host: &str,
    ) -> Result<ScheduleData, String> {
        ScheduleData::take(text, range, Some(claimed), host)
    }

    /// [`ScheduleData::received`] for text that something else vouches for, so that the data is
    /// not hashed: the caller checked the hash of the very bytes it came in against one the
    /// schedule's maker announced (the `lz4_sha1` of its ping). It is still checked to be a JSON
    /// object serde_json would parse, in the pass that finds `host`'s view.
    pub(crate) fn received_vouched(
        text: String,
        range: std::ops::Range<usize>,
        host: &str,
    ) -> Result<ScheduleData, String> {
        ScheduleData::take(text, range, None, host)
    }

    fn take(
        text: String,
        range: std::ops::Range<usize>,
        claimed: Option<&str>,
        host: &str,
    ) -> Result<ScheduleData, String> {
        let Some(data) = text.get(range.clone()) else {
            return Err(text);
        };
        if claimed.is_some_and(|claimed| hash_canonical(data.as_bytes()) != claimed) {
            return Err(text);
        }
        // Vouched-for text is its maker's own, which this version writes canonically; text
        // that merely hashes to its hash may be spaced (a maker may hash what it likes).
        let Some(view) = view_data(data, host, claimed.is_none()) else {
            return Err(text);
        };
        let view = (host.to_string(), view);
        Ok(ScheduleData::within(
            text,
            range,
            OnceLock::new(),
            Some(view),
        ))
    }

    /// The canonical JSON text: what the hash covers and what is written and served.
    pub fn canonical(&self) -> &str {
        &self.0.text[self.0.range.clone()]
    }

    /// Bytes of the canonical text.
    pub fn len(&self) -> usize {
        self.canonical().len()
    }

    pub fn is_empty(&self) -> bool {
        self.canonical().is_empty()
    }

    /// SHA-1 hex of the canonical text: the schedule hash.
    pub(crate) fn hash(&self) -> String {
        hash_canonical(self.canonical().as_bytes())
    }

    /// The whole data as a tree, parsed on the first call (milliseconds for a megabyte; most
    /// nodes never need it, see the module docs).
    pub fn tree(&self) -> &Arc<Value> {
        self.0.tree.get_or_init(|| {
            Arc::new(serde_json::from_str(self.canonical()).expect("schedule data is JSON"))
        })
    }

    /// Whether [`ScheduleData::tree`] has been made (for tests and diagnostics).
    pub fn is_parsed(&self) -> bool {
        self.0.tree.get().is_some()
    }

    /// Every role the schedule mentions ([`crate::render::vars::all_roles`]), found once per schedule,
    /// by scanning the text when the tree is not made.
    pub fn all_roles(&self) -> &BTreeSet<String> {
        self.0.all_roles.get_or_init(|| {
            if let Some(tree) = self.0.tree.get() {
                return crate::render::vars::all_roles(tree);
            }
            let mut de = serde_json::Deserializer::from_str(self.canonical());
            // The text is JSON; not an object at the top: no roles.
            RolesSeed(Depth::Top)
                .deserialize(&mut de)
                .map(one)
                .unwrap_or_default()
        })
    }

    /// [`ScheduleData::node_view`] as data of its own: the one cut when the text was received,
    /// shared, when it was cut for `host` (no copy of the tree, no second canonical writing).
    ///
    /// Data this node wrote (the leader's own schedule) has its view cut from the text as a
    /// follower cuts one it takes ([`ScheduleData::received_vouched`]): neither the whole tree
    /// parsed nor the view written again, and a role's big own values kept as text. The leader
    /// renders its roles while its followers take the schedule, on the same cores in a test
    /// fleet, so this is CPU off every follower's path there (issue 32 §1).
    pub(crate) fn node_view_data(&self, host: &str) -> ScheduleData {
        match &self.0.view {
            Some((cut_for, view)) if cut_for == host => view.clone(),
            _ if self.0.written_here => view_data(self.canonical(), host, true)
                .unwrap_or_else(|| ScheduleData::from_value(self.node_view(host))),
            _ => ScheduleData::from_value(self.node_view(host)),
        }
    }

    /// The part of the data node `host` renders from: [`VIEW_KEYS`] and `nodes[host]`, as an
    /// object holding those keys that are present (`nodes` then holds `host` alone). Read from
    /// the tree when it is made, otherwise by scanning the text once without building the rest.
    pub fn node_view(&self, host: &str) -> Value {
        if let Some((cut_for, view)) = &self.0.view
            && cut_for == host
        {
            return view.tree().as_ref().clone();
        }
        if let Some(tree) = self.0.tree.get() {
            return project(tree, host);
        }
        // Not an object at the top: nothing of it is rendered.
        Value::Object(cut_view(self.canonical(), host).unwrap_or_default())
    }
}

/// [`ScheduleData::node_view`] of a parsed tree.
fn project(tree: &Value, host: &str) -> Value {
    let mut view = Map::new();
    let Some(data) = tree.as_object() else {
        return Value::Object(view);
    };
    for key in VIEW_KEYS {
        if let Some(value) = data.get(*key) {
            view.insert((*key).to_string(), value.clone());
        }
    }
    if let Some(node) = data.get("nodes").and_then(|n| n.get(host)) {
        let mut nodes = Map::new();
        nodes.insert(host.to_string(), node.clone());
        view.insert("nodes".into(), Value::Object(nodes));
    }
    Value::Object(view)
}

/// Texts this big give their buffer to the next schedule when dropped ([`text_buffer`]).
const SPARE_MIN: usize = 64 << 10;

/// How many dropped buffers [`SPARE`] keeps: a schedule's text and its node view's (which, with
/// a big role every node is given, is as big).
const SPARE_KEPT: usize = 2;

/// The buffers of the last schedule texts dropped that were at least [`SPARE_MIN`] bytes, at
/// most [`SPARE_KEPT`] (the biggest).
static SPARE: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

/// An empty buffer for a schedule's text of about `size` bytes (a schedule arriving from a
/// peer, or a node's view of one): the buffer of a schedule dropped when one is big enough, a
/// new one otherwise. A node that takes a megabyte's schedule every few seconds then writes it
/// into memory it already has, not into a thousand fresh pages the kernel must fault in and
/// zero; it keeps [`SPARE_KEPT`] such buffers, the size of its last schedule and view.
pub fn text_buffer(size: usize) -> Vec<u8> {
    if size < SPARE_MIN {
        return Vec::with_capacity(size);
    }
    let spare = take_spare(&mut SPARE.lock().unwrap_or_else(|e| e.into_inner()), size);
    // With room for the next schedules to grow a little (a version string, a few services)
    // and still fit.
    spare.unwrap_or_else(|| Vec::with_capacity(size + size / 16))
}

/// A buffer of `spare` with room for `size` bytes, taken out of it.
fn take_spare(spare: &mut Vec<Vec<u8>>, size: usize) -> Option<Vec<u8>> {
    let at = spare.iter().position(|b| b.capacity() >= size)?;
    Some(spare.swap_remove(at))
}

/// Keeps `buffer` (emptied) in `spare`, which then holds at most [`SPARE_KEPT`]: the biggest.
fn give_spare(spare: &mut Vec<Vec<u8>>, mut buffer: Vec<u8>) {
    buffer.clear();
    spare.push(buffer);
    if spare.len() > SPARE_KEPT {
        let smallest = (0..spare.len())
            .min_by_key(|&i| spare[i].capacity())
            .expect("not empty");
        spare.swap_remove(smallest);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.text.capacity() >= SPARE_MIN {
            let buffer = std::mem::take(&mut self.text).into_bytes();
            give_spare(&mut SPARE.lock().unwrap_or_else(|e| e.into_inner()), buffer);
        }
    }
}

/// `host`'s view of the JSON text `data` ([`ScheduleData::node_view`]), checked and cut in one
/// pass ([`scan::cut`]); `None` when serde_json would refuse the text or it is not an object.
fn cut_view(data: &str, host: &str) -> Option<Map<String, Value>> {
    let cut = scan::cut(data, host)?;
    let mut view = Map::new();
    for (key, range) in VIEW_KEYS.iter().zip(cut.keys) {
        if let Some(range) = range {
            view.insert((*key).to_string(), serde_json::from_str(&data[range]).ok()?);
        }
    }
    if let Some(range) = cut.node {
        let mut nodes = Map::new();
        nodes.insert(host.to_string(), serde_json::from_str(&data[range]).ok()?);
        view.insert("nodes".into(), Value::Object(nodes));
    }
    Some(view)
}

/// `host`'s view of the JSON text `data` as data of its own: its text put together from the
/// parts of `data` it keeps, in the order of their keys, and their trees parsed. Parts of text
/// that is canonical are canonical, so the view's text is too, without a tree written out again
/// (for a big shared role, a megabyte per change on every node). With `canonical` (the text is
/// known to be canonical, not only to be what its hash covers) it notes where each role's text
/// is ([`ScheduleData::role_text`]). `None` as for [`cut_view`].
fn view_data(data: &str, host: &str, canonical: bool) -> Option<ScheduleData> {
    let cut = scan::cut(data, host)?;
    let [changes, roles, vars] = cut.keys.clone();
    let mut role_parts = BTreeMap::new();
    let mut unparsed = BTreeMap::new();
    let parts: usize = [&changes, &cut.node, &roles, &vars]
        .into_iter()
        .flatten()
        .map(|r| r.len())
        .sum();
    let buffer = text_buffer(parts + host.len() + 48);
    let mut text = String::from_utf8(buffer).expect("an empty buffer");
    let mut view = Map::new();
    text.push('{');
    // `nodes` sorts between `changes` and `roles`.
    for (key, range) in [
        ("changes", changes),
        ("nodes", cut.node.clone()),
        ("roles", roles),
        ("vars", vars),
    ] {
        let Some(range) = range else { continue };
        let part = &data[range.clone()];
        let big_roles = key == "roles" && canonical && part.starts_with('{');
        let mut value: Value = match big_roles {
            true => Value::Null,
            false => serde_json::from_str(part).ok()?,
        };
        if text.len() > 1 {
            text.push(',');
        }
        text.push('"');
        text.push_str(key);
        text.push_str("\":");
        if key == "nodes" {
            let mut key = Vec::new();
            serde_json::to_writer(&mut key, host).expect("a string serializes");
            text.push('{');
            text.push_str(std::str::from_utf8(&key).expect("serde_json writes UTF-8"));
            text.push(':');
            text.push_str(part);
            text.push('}');
            let mut nodes = Map::new();
            nodes.insert(host.to_string(), value);
            value = Value::Object(nodes);
        } else {
            if key == "roles" && canonical {
                // Ranges in `data` to ranges in `text`; a role given twice keeps its last entry,
                // as a parse does.
                let (from, to) = (range_start(data, part), text.len());
                for (name, at) in &cut.roles {
                    let name = &data[name.clone()];
                    let name = match name.contains('\\') {
                        false => name[1..name.len() - 1].to_string(),
                        true => serde_json::from_str(name).ok()?,
                    };
                    role_parts.insert(name, at.start - from + to..at.end - from + to);
                }
            }
            if big_roles {
                let shift = |at: &std::ops::Range<usize>| {
                    let from = range_start(data, part);
                    at.start - from + text.len()..at.end - from + text.len()
                };
                value = roles_skeleton(data, &cut, shift, &mut unparsed)?;
            }
            text.push_str(part);
        }
        view.insert(key.to_string(), value);
    }
    text.push('}');
    let view = Arc::new(Value::Object(view));
    let (tree, skeleton) = match unparsed.is_empty() {
        true => (OnceLock::from(view), None),
        false => (OnceLock::new(), Some(view)),
    };
    let mut view = ScheduleData::with(text, tree, None);
    let inner = Arc::get_mut(&mut view.0).expect("just made");
    inner.roles = role_parts;
    inner.skeleton = skeleton;
    inner.unparsed = unparsed;
    Some(view)
}

/// The `roles` object of a view's skeleton ([`ScheduleData::skeleton`]), from the entries the
/// cut found in `data`: each role's value parsed, except its own values of [`UNPARSED_MIN`]
/// bytes or more that may be left as text, which are null here and noted in `unparsed` (by role,
/// with their ranges in the view's text, which `shift` gives). A key given twice keeps its last
/// value, as a parse does.
fn roles_skeleton(
    data: &str,
    cut: &scan::Cut,
    shift: impl Fn(&std::ops::Range<usize>) -> std::ops::Range<usize>,
    unparsed: &mut BTreeMap<String, Vec<Unparsed>>,
) -> Option<Value> {
    let key_of = |at: &std::ops::Range<usize>| -> Option<String> {
        let written = &data[at.clone()];
        match written.contains('\\') {
            false => Some(written[1..written.len() - 1].to_string()),
            true => serde_json::from_str(written).ok(),
        }
    };
    let may_leave = |key: &str, at: &std::ops::Range<usize>| {
        at.len() >= UNPARSED_MIN
            && !crate::render::vars::KEPT_PARSED.contains(&key)
            && !crate::refs::json_may_hold_refs(&data[at.clone()])
    };
    let mut roles = Map::new();
    for ((name, at), entries) in cut.roles.iter().zip(&cut.role_entries) {
        let name = key_of(name)?;
        unparsed.remove(&name);
        if !entries.iter().any(|(_, at)| at.len() >= UNPARSED_MIN) {
            roles.insert(name, serde_json::from_str(&data[at.clone()]).ok()?);
            continue;
        }
        let mut role = Map::new();
        let mut left: Vec<Unparsed> = Vec::new();
        for (key, at) in entries {
            let key = key_of(key)?;
            left.retain(|(k, ..)| *k != key);
            if may_leave(&key, at) {
                let tape = cut.tapes.get(&at.start).cloned().unwrap_or_default();
                left.push((key.clone(), shift(at), tape));
                role.insert(key, Value::Null);
            } else {
                role.insert(key, serde_json::from_str(&data[at.clone()]).ok()?);
            }
        }
        if !left.is_empty() {
            left.sort_by(|a, b| a.0.cmp(&b.0));
            unparsed.insert(name.clone(), left);
        }
        roles.insert(name, Value::Object(role));
    }
    Some(Value::Object(roles))
}

/// Where `part`, a slice of `data`, starts in it.
fn range_start(data: &str, part: &str) -> usize {
    part.as_ptr() as usize - data.as_ptr() as usize
}

/// Where [`RolesSeed`] reads: role names are the keys of `roles` at the top and of `roles` in
/// each entry of `nodes`. A key given twice keeps its last value, as a parsed tree does, so each
/// level returns what it found instead of adding to one set.
#[derive(Clone, Copy)]
enum Depth {
    /// The data object: all its role names.
    Top,
    /// `nodes`: role names by node.
    Nodes,
    /// One entry of `nodes`: the names in its `roles`.
    Node,
    /// A `roles` object: its keys.
    Roles,
}

/// Role names by node (`Depth::Nodes`) or one set of them (the other depths, under "").
type Found = BTreeMap<String, BTreeSet<String>>;

/// Reads the role names at its depth, skipping everything else; anything but an object holds
/// none.
struct RolesSeed(Depth);

impl<'de> DeserializeSeed<'de> for RolesSeed {
    type Value = Found;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Found, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RolesSeed {
    type Value = Found;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let mut top_roles = BTreeSet::new();
        let mut nodes = Found::new();
        let mut names = BTreeSet::new();
        while let Some(key) = map.next_key::<String>()? {
            match (self.0, key.as_str()) {
                (Depth::Top, "roles") => {
                    top_roles = one(map.next_value_seed(RolesSeed(Depth::Roles))?);
                }
                (Depth::Top, "nodes") => nodes = map.next_value_seed(RolesSeed(Depth::Nodes))?,
                (Depth::Nodes, _) => {
                    let node = one(map.next_value_seed(RolesSeed(Depth::Node))?);
                    nodes.insert(key, node);
                }
                (Depth::Node, "roles") => {
                    names = one(map.next_value_seed(RolesSeed(Depth::Roles))?);
                }
                (Depth::Roles, _) => {
                    map.next_value::<IgnoredAny>()?;
                    names.insert(key);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(match self.0 {
            Depth::Nodes => nodes,
            Depth::Top => {
                top_roles.extend(nodes.into_values().flatten());
                Found::from([(String::new(), top_roles)])
            }
            Depth::Node | Depth::Roles => Found::from([(String::new(), names)]),
        })
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Found::new())
    }

    fn visit_bool<E>(self, _: bool) -> Result<Found, E> {
        Ok(Found::new())
    }

    fn visit_i64<E>(self, _: i64) -> Result<Found, E> {
        Ok(Found::new())
    }

    fn visit_u64<E>(self, _: u64) -> Result<Found, E> {
        Ok(Found::new())
    }

    fn visit_f64<E>(self, _: f64) -> Result<Found, E> {
        Ok(Found::new())
    }

    fn visit_str<E>(self, _: &str) -> Result<Found, E> {
        Ok(Found::new())
    }

    fn visit_unit<E>(self) -> Result<Found, E> {
        Ok(Found::new())
    }
}

/// The one set of names a non-`Nodes` level found.
fn one(found: Found) -> BTreeSet<String> {
    found.into_values().next().unwrap_or_default()
}

/// The canonical text as a JSON value. serde_json reads the text again to hand it over (a scan,
/// no tree); the paths that run on every schedule change (storing, serving to peers) write it
/// themselves with [`crate::state::Schedule::write_json`].
impl Serialize for ScheduleData {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw: &RawValue =
            serde_json::from_str(self.canonical()).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

impl PartialEq for ScheduleData {
    fn eq(&self, other: &ScheduleData) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.canonical() == other.canonical()
    }
}

/// The data equals a tree when its own tree does (tests compare a scheduler's output so).
impl PartialEq<Value> for ScheduleData {
    fn eq(&self, other: &Value) -> bool {
        **self.tree() == *other
    }
}

impl std::fmt::Debug for ScheduleData {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        const SHOWN: usize = 200;
        let text = self.canonical();
        if text.len() <= SHOWN {
            write!(f, "ScheduleData({text})")
        } else {
            let mut cut = SHOWN;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            write!(f, "ScheduleData({}… {} bytes)", &text[..cut], text.len())
        }
    }
}

mod scan;

#[cfg(test)]
mod tests;
