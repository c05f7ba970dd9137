//! Wall-clock time: the [`Clock`] port every controller reads, and the one timestamp format
//! people read (RFC 3339, UTC) as the deployment log, the API and the role logs write it.

/// Wall-clock time, as milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// `2026-11-22T04:55:49Z` for wall-clock milliseconds since the Unix epoch (whole seconds, UTC).
/// Every timestamp the daemon writes for people goes through here.
pub fn rfc3339(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn whole_seconds_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_323_349_999), "2026-11-22T04:55:49Z");
    }
}
