//! Who this machine is: its machine id and host name. The daemon (`Config::load`) and the
//! offline commands (`check`, `schedule`) read them here, with the same precedence and the same
//! messages.

use std::path::Path;

use verwalter_controllers::defaults::MACHINE_ID_FILE;

/// A machine id is 32 hex digits (16 bytes); stored lowercase.
pub(crate) fn parse_machine_id(text: &str) -> Result<String, String> {
    let id = text.trim();
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(id.to_ascii_lowercase())
    } else {
        Err(format!("machine id must be 32 hex digits, got {id:?}"))
    }
}

/// The machine id in `path` (`/etc/machine-id`'s format).
pub(crate) fn read_machine_id(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the machine id from {}: {e}; run `systemd-machine-id-setup` or pass \
             --override-machine-id",
            path.display()
        )
    })?;
    parse_machine_id(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The machine id: `--override-machine-id`, else the settings file's `machine-id`, else
/// `/etc/machine-id`. The error names where the bad value came from.
pub fn machine_id(flag: Option<&str>, settings: Option<&str>) -> Result<String, String> {
    match (flag, settings) {
        (Some(id), _) => parse_machine_id(id).map_err(|e| format!("--override-machine-id: {e}")),
        (None, Some(id)) => {
            parse_machine_id(id).map_err(|e| format!("machine-id in the settings file: {e}"))
        }
        (None, None) => read_machine_id(Path::new(MACHINE_ID_FILE)),
    }
}

/// The host name: `--hostname`, else the settings file's `hostname`, else the system's. Empty is
/// an error.
pub fn hostname(flag: Option<&str>, settings: Option<&str>) -> Result<String, String> {
    let name = match flag.or(settings) {
        Some(name) => name.to_string(),
        None => nix::unistd::gethostname()
            .map_err(|e| format!("cannot read the system's host name: {e}; pass --hostname"))?
            .into_string()
            .map_err(|raw| {
                format!("the system's host name {raw:?} is not UTF-8: pass --hostname")
            })?,
    };
    if name.is_empty() {
        return Err("host name is empty: pass --hostname".into());
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_id_precedence_and_messages_name_the_source() {
        let id = "0123456789ABCDEF0123456789abcdef";
        assert_eq!(
            machine_id(Some(id), Some("bad")).unwrap(),
            id.to_ascii_lowercase()
        );
        let err = machine_id(None, Some("bad")).unwrap_err();
        assert!(err.starts_with("machine-id in the settings file:"), "{err}");
        let err = machine_id(Some("xyz"), None).unwrap_err();
        assert!(err.starts_with("--override-machine-id:"), "{err}");
    }

    #[test]
    fn missing_machine_id_file_says_what_to_do() {
        let err = read_machine_id(Path::new("/nonexistent/machine-id")).unwrap_err();
        assert!(err.contains("/nonexistent/machine-id"), "{err}");
        assert!(err.contains("--override-machine-id"), "{err}");
    }

    #[test]
    fn an_empty_host_name_is_refused() {
        assert_eq!(hostname(Some("a"), Some("b")).unwrap(), "a");
        assert_eq!(hostname(None, Some("b")).unwrap(), "b");
        assert!(hostname(Some(""), None).unwrap_err().contains("--hostname"));
    }
}
