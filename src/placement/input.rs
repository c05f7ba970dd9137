//! Reading an input file of the placement commands within a size cap: only a regular file is
//! read (a FIFO, a device such as `/dev/zero` or a directory is refused without reading it, and
//! a FIFO is not waited on), and a file over the cap, or one that grows past it while it is
//! read, is refused.

use std::io::Read;
use std::path::Path;

/// The placement config, and the simulator's node and task files: far above any real one
/// (wca's config and experiment are a few KiB), far below what would take the memory.
pub(crate) const MAX_CONFIG_BYTES: u64 = verwalter_placement::experiment::MAX_FILE_BYTES;
/// A snapshot file: 5,000 nodes with their apps are a few MB.
pub(crate) const MAX_SNAPSHOT_BYTES: u64 = 64 << 20;

/// The bytes of the regular file at `path`, at most `limit` of them; the problem otherwise,
/// without the path (the caller names the file as it names it elsewhere).
pub(crate) fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    // Without blocking: opening a FIFO for reading would wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(format!(
            "not a regular file ({}); give a file",
            file_kind(&meta)
        ));
    }
    if meta.len() > limit {
        return Err(format!(
            "{} bytes, over the limit of {limit} bytes",
            meta.len()
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > limit {
        return Err(format!("over the limit of {limit} bytes"));
    }
    Ok(bytes)
}

/// [`read_capped`] as UTF-8 text.
pub(crate) fn read_text_capped(path: &Path, limit: u64) -> Result<String, String> {
    let bytes = read_capped(path, limit)?;
    String::from_utf8(bytes).map_err(|e| format!("not UTF-8 text: {e}"))
}

fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    crate::storage::state_dir::special_kind(meta.file_type()).unwrap_or("not a file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_cap_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a.yaml");
        std::fs::write(&file, "abc").unwrap();
        assert_eq!(read_capped(&file, 3).unwrap(), b"abc");
        assert_eq!(
            read_capped(&file, 2).unwrap_err(),
            "3 bytes, over the limit of 2 bytes"
        );
        assert_eq!(
            read_capped(Path::new("/dev/zero"), 10).unwrap_err(),
            "not a regular file (a character device); give a file"
        );
        assert_eq!(
            read_capped(tmp.path(), 10).unwrap_err(),
            "not a regular file (a directory); give a file"
        );
        let fifo = tmp.path().join("f");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(
            read_capped(&fifo, 10).unwrap_err(),
            "not a regular file (a FIFO); give a file"
        );
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        assert!(
            read_text_capped(&file, 10)
                .unwrap_err()
                .starts_with("not UTF-8")
        );
    }
}
