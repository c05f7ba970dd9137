//! The log of one role's attempt: variables, files written, command output, result.

use std::io::Write;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{Map, Value};
use verwalter_controllers::render::vars::logged::{self, Logged};
use verwalter_controllers::schedule::data::TextPart;

use super::{LogDir, Marker, Pointer, Segment, marker_line, open_segment};
use crate::render::apply::ApplyLog;

/// Writer of one role's entries; every entry is indexed under the deployment id.
#[derive(Debug)]
pub(crate) struct RoleLog {
    dir: Arc<LogDir>,
    role: String,
    deployment_id: String,
    segment: Option<Segment>,
}

impl RoleLog {
    /// A role log that could not be opened drops its entries (the role still renders); the
    /// failure is reported by the log dir.
    pub(super) fn start(dir: Arc<LogDir>, role: &str, deployment_id: &str) -> RoleLog {
        let path = dir.dir.join(role);
        let segment = match open_segment(&path, &dir.limits) {
            Ok(segment) => Some(segment),
            Err(e) => {
                dir.write_failed(role, format_args!("{}: {e}", path.display()));
                None
            }
        };
        let mut log = RoleLog {
            dir,
            role: role.to_string(),
            deployment_id: deployment_id.to_string(),
            segment,
        };
        log.marker(Marker::RoleStart, "");
        log
    }

    /// The variables the templates see, secrets masked, `full_schedule` summarised: whole (or by
    /// key with digests when big) when `last` is `None`, else what changed since `last`
    /// (`verwalter_controllers::render::vars::logged`).
    pub(crate) fn vars(
        &mut self,
        last: Option<Logged<'_>>,
        vars: &Map<String, Value>,
        texts: &[(String, TextPart)],
    ) {
        let text = logged::entry(&self.role, last, vars, texts);
        self.write(text.as_bytes());
    }

    pub(crate) fn action_start(&mut self, name: &str) {
        self.marker(Marker::ActionStart(name.to_string()), "");
    }

    pub(crate) fn action_finish(&mut self, name: &str) {
        self.marker(Marker::ActionFinish(name.to_string()), "");
    }

    /// Free text (one or more whole lines).
    pub(crate) fn text(&mut self, text: &str) {
        self.write(text.as_bytes());
    }

    /// Writes the result and the `RoleFinish` marker.
    pub(crate) fn finish(
        mut self,
        result: &Result<(), verwalter_controllers::machinery::ports::ApplyError>,
    ) {
        let text = match result {
            Ok(()) => "result: ok\n".to_string(),
            Err(e) => format!("result: error: {e}\n"),
        };
        self.marker(Marker::RoleFinish, &text);
    }

    fn marker(&mut self, marker: Marker, text: &str) {
        let header = marker_line(&self.deployment_id, Some(&self.role), &marker);
        if let Some(offset) = self.write(format!("{header}{text}").as_bytes()) {
            let seg = self
                .segment
                .as_ref()
                .map(|s| s.name.clone())
                .unwrap_or_default();
            self.dir.index(
                &self.deployment_id,
                &Pointer::Role(self.role.clone(), seg, offset),
                &marker,
            );
        }
    }

    /// Appends bytes; returns the offset they start at.
    fn write(&mut self, bytes: &[u8]) -> Option<u64> {
        let seg = self.segment.as_mut()?;
        let offset = seg.len;
        match seg.file.write_all(bytes) {
            Ok(()) => {
                seg.len += bytes.len() as u64;
                self.dir.write_ok(&self.role);
                Some(offset)
            }
            Err(e) => {
                // The attempt's further entries are dropped; the next attempt opens it again.
                let path = self.dir.dir.join(&self.role);
                self.dir
                    .write_failed(&self.role, format_args!("{}: {e}", path.display()));
                self.segment = None;
                None
            }
        }
    }
}

impl ApplyLog for RoleLog {
    fn line(&mut self, text: &str) {
        let stamped = format!("{} {text}\n", super::rfc3339(SystemTime::now()));
        self.write(stamped.as_bytes());
    }

    fn output(&mut self, bytes: &[u8]) {
        self.write(bytes);
    }

    fn external_log(&mut self, path: &str, offset: u64) {
        self.dir.index(
            &self.deployment_id,
            &Pointer::External(path.to_string(), offset),
            &Marker::ExternalLog,
        );
    }
}
