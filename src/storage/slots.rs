//! The schedule in force in two slot files, `<storage>/schedule.slot0` and `schedule.slot1`,
//! rewritten in place by turns with one `fdatasync`: the one flush on the way from a scheduler
//! run (or a fetched schedule) to putting it in force. `schedule/schedule.json` is written after
//! the slot for readers and 0.13, without flushes (see `StateDir::save_schedule`). Which slot
//! a start takes, and which one is written next, is decided in
//! `verwalter_controllers::storage::slots`.
//!
//! A slot is a 32-byte header and the body: exactly the bytes `schedule.json` gets (the
//! envelope, compact, with its newline).
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | magic `vwSLOT01` |
//! | 8..16 | sequence number, little-endian: one more than the slot written before |
//! | 16..24 | body length, little-endian |
//! | 24..28 | CRC-32 of bytes 8..24 and the body, little-endian |
//! | 28..32 | zero |
//!
//! The file may be longer than the header and body (room kept for a larger schedule, or what a
//! longer one left); only `length` bytes are read. A slot whose header, length or checksum is
//! wrong is torn (a crash while it was rewritten) or corrupt, and ignored.

use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::storage::state_dir::{
    MAX_STORED_SCHEDULE, create_private, open_own, open_regular, sync_dir,
};

/// The slot files' names, directly in the storage dir.
pub(crate) const SLOT_NAMES: [&str; 2] = ["schedule.slot0", "schedule.slot1"];

const MAGIC: [u8; 8] = *b"vwSLOT01";

/// The header's length; the body follows.
pub(crate) const HEADER_LEN: usize = 32;

/// A slot file is shrunk when it is larger than twice what it holds plus this (a schedule
/// that became much smaller), not at every small change.
const SHRINK_SLACK: u64 = 1 << 20;

/// `<root>/schedule.slot<n>`.
pub(crate) fn slot_path(root: &Path, slot: usize) -> PathBuf {
    root.join(SLOT_NAMES[slot])
}

/// Why a slot is not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SlotFault {
    #[error("cannot read: {0}")]
    Read(#[source] io::Error),
    #[error("{0} bytes, shorter than a slot's header (torn)")]
    Short(u64),
    #[error("not a schedule slot (wrong magic)")]
    Magic,
    #[error(
        "says it holds {0} bytes, more than the {MAX_STORED_SCHEDULE} a stored schedule may have"
    )]
    TooLong(u64),
    #[error("cut short: {have} bytes after the header, {want} expected (torn)")]
    Cut { have: u64, want: u64 },
    #[error("checksum mismatch (torn or corrupt)")]
    Checksum,
}

/// A slot whose header and checksum are right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotBody {
    pub(crate) seq: u64,
    pub(crate) body: Vec<u8>,
}

fn checksum(seq: u64, parts: &[&[u8]]) -> u32 {
    let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let mut crc = flate2::Crc::new();
    crc.update(&seq.to_le_bytes());
    crc.update(&len.to_le_bytes());
    for part in parts {
        crc.update(part);
    }
    crc.sum()
}

/// The header of a slot holding `parts` (one after the other) as sequence `seq`.
pub(crate) fn header(seq: u64, parts: &[&[u8]]) -> [u8; HEADER_LEN] {
    let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(&MAGIC);
    header[8..16].copy_from_slice(&seq.to_le_bytes());
    header[16..24].copy_from_slice(&len.to_le_bytes());
    header[24..28].copy_from_slice(&checksum(seq, parts).to_le_bytes());
    header
}

/// Reads the slot `path`: `None` when there is none, the fault when it is not usable (not a
/// regular file, torn, corrupt). Reads the header and then only the length it gives.
pub(crate) fn read(path: &Path) -> Result<Option<SlotBody>, SlotFault> {
    let Some(file) = open_regular(path).map_err(SlotFault::Read)? else {
        return Ok(None);
    };
    let size = file.metadata().map_err(SlotFault::Read)?.len();
    if size < HEADER_LEN as u64 {
        return Err(SlotFault::Short(size));
    }
    let mut head = [0u8; HEADER_LEN];
    file.read_exact_at(&mut head, 0).map_err(SlotFault::Read)?;
    if head[..8] != MAGIC {
        return Err(SlotFault::Magic);
    }
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap());
    let (seq, len) = (word(8), word(16));
    if len > MAX_STORED_SCHEDULE {
        return Err(SlotFault::TooLong(len));
    }
    let have = size - HEADER_LEN as u64;
    if have < len {
        return Err(SlotFault::Cut { have, want: len });
    }
    let mut body = vec![0u8; len as usize];
    file.read_exact_at(&mut body, HEADER_LEN as u64)
        .map_err(SlotFault::Read)?;
    if head[24..28] != checksum(seq, &[&body]).to_le_bytes() || head[28..] != [0; 4] {
        return Err(SlotFault::Checksum);
    }
    Ok(Some(SlotBody { seq, body }))
}

/// Writes `parts` as sequence `seq` over slot `slot` in `root`, in place, and flushes it with
/// one `fdatasync`. The file is made (private, its entry synced) the first time, or when
/// anything but a regular file of its own is in its place (replaced, never written through).
/// When it is too small it grows with a quarter to spare, so a growing schedule does not
/// change its size at every write.
pub(crate) fn write(root: &Path, slot: usize, seq: u64, parts: &[&[u8]]) -> io::Result<()> {
    let path = slot_path(root, slot);
    let (file, made) = match open_own(&path) {
        Some(file) => (file, false),
        None => (make(root, &path)?, true),
    };
    let len = HEADER_LEN as u64 + parts.iter().map(|p| p.len() as u64).sum::<u64>();
    let size = file.metadata()?.len();
    if size < len || size > 2 * len + SHRINK_SLACK {
        file.set_len((len + len / 4).next_multiple_of(4096))?;
    }
    file.write_all_at(&header(seq, parts), 0)?;
    let mut at = HEADER_LEN as u64;
    for part in parts {
        file.write_all_at(part, at)?;
        at += part.len() as u64;
    }
    file.sync_data()?;
    if made {
        sync_dir(root)?;
    }
    Ok(())
}

/// Creates the slot file `path` (and the storage dir when there is none yet); whatever else is
/// in its place goes first (only the entry).
fn make(root: &Path, path: &Path) -> io::Result<fs::File> {
    if !root.is_dir() {
        fs::create_dir_all(root)?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    match create_private(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            tracing::warn!(path = %path.display(), "Replacing what is in the place of a schedule slot (it is not followed).");
            fs::remove_file(path)?;
            create_private(path)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_reads_back_as_written_and_any_damage_is_a_fault() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("storage");
        let path = slot_path(&root, 1);
        assert!(read(&path).unwrap().is_none(), "none yet");
        write(&root, 1, 41, &[b"{\"a\":", b"1}\n"]).unwrap();
        let want = SlotBody {
            seq: 41,
            body: b"{\"a\":1}\n".to_vec(),
        };
        assert_eq!(read(&path).unwrap(), Some(want));
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len() % 4096, 0, "room kept");
        // A longer body, then a shorter one over it: each reads back whole.
        let long = vec![b'x'; 10_000];
        write(&root, 1, 43, &[&long]).unwrap();
        assert_eq!(read(&path).unwrap().unwrap().body, long);
        write(&root, 1, 45, &[b"short"]).unwrap();
        assert_eq!(read(&path).unwrap().unwrap().body, b"short");
        assert_eq!(read(&path).unwrap().unwrap().seq, 45);

        let good = fs::read(&path).unwrap();
        let damaged = |at: usize| {
            let mut bytes = good.clone();
            bytes[at] ^= 0x20;
            fs::write(&path, &bytes).unwrap();
            read(&path).unwrap_err().to_string()
        };
        assert_eq!(damaged(0), "not a schedule slot (wrong magic)");
        for at in [8, 24, 29, HEADER_LEN, HEADER_LEN + 4] {
            assert_eq!(
                damaged(at),
                "checksum mismatch (torn or corrupt)",
                "byte {at}"
            );
        }
        // The length changed: longer than the file, or shorter (the checksum covers it).
        let mut bytes = good.clone();
        bytes[18] = 0x10;
        fs::write(&path, &bytes).unwrap();
        assert!(
            read(&path)
                .unwrap_err()
                .to_string()
                .starts_with("cut short"),
            "{:?}",
            read(&path)
        );
        bytes[18] = 0;
        bytes[16] = 4;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(
            read(&path).unwrap_err().to_string(),
            "checksum mismatch (torn or corrupt)"
        );
        // Torn: the header cut short, or the body.
        fs::write(&path, &good[..20]).unwrap();
        assert_eq!(
            read(&path).unwrap_err().to_string(),
            "20 bytes, shorter than a slot's header (torn)"
        );
        fs::write(&path, &good[..HEADER_LEN + 2]).unwrap();
        assert_eq!(
            read(&path).unwrap_err().to_string(),
            "cut short: 2 bytes after the header, 5 expected (torn)"
        );
        // A length over the limit is refused before anything is allocated for it.
        let mut bytes = good.clone();
        bytes[16..24].copy_from_slice(&(MAX_STORED_SCHEDULE + 1).to_le_bytes());
        fs::write(&path, &bytes).unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("more than"));
        // Rewritten whole again, it is good.
        write(&root, 1, 47, &[b"again"]).unwrap();
        assert_eq!(read(&path).unwrap().unwrap().body, b"again");
    }

    /// A link in a slot's place is neither read nor written through; the write replaces it.
    #[test]
    fn a_link_as_a_slot_is_refused_and_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::write(&outside, "precious").unwrap();
        let path = slot_path(tmp.path(), 0);
        std::os::unix::fs::symlink(&outside, &path).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("a symbolic link, not a regular file"), "{err}");
        write(tmp.path(), 0, 1, &[b"body"]).unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
        assert!(fs::symlink_metadata(&path).unwrap().is_file());
        assert_eq!(read(&path).unwrap().unwrap().body, b"body");
    }
}
