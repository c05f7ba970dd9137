//! `verwalter check --placement-config FILE`: loads a placement config as the extender would
//! (with the process environment for `!Env`) and says what it holds or where it is wrong.

use std::path::Path;
use std::process::ExitCode;

use verwalter_placement::config;

/// Prints `FILE: ok` and what the file holds (stdout), or `FILE:LINE: problem` (stderr, exit 1).
pub fn check_file(path: &Path) -> ExitCode {
    let text = super::input::read_text_capped(path, super::input::MAX_CONFIG_BYTES);
    match check_text(path, text, |n| std::env::var(n).ok()) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(problem) => {
            eprintln!("{problem}");
            eprintln!("1 problem(s) found");
            ExitCode::from(1)
        }
    }
}

/// The report or the one problem, both prefixed with the file's name (and the line, if known).
fn check_text(
    path: &Path,
    text: Result<String, String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let file = path.display();
    let text = text.map_err(|e| format!("{file}: cannot read: {e}"))?;
    match config::load_config(&text, env) {
        Ok(loaded) => Ok(format!("{file}: ok\n{}", config::describe(&loaded))),
        Err(e) => Err(match e.line() {
            Some(line) => format!("{file}:{line}: {}", e.message()),
            None => format!("{file}: {}", e.message()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_file_colon_line() {
        let path = Path::new("c.yaml");
        let text = "algorithm: !Fit\n  cpu_scale_factor: x\n".to_string();
        let e = check_text(path, Ok(text), |_| None).unwrap_err();
        assert!(e.starts_with("c.yaml:2: "), "{e}");
        assert!(!e.contains("at line"), "the line is said once: {e}");
        let e = check_text(path, Err("No such file".into()), |_| None);
        assert!(e.unwrap_err().starts_with("c.yaml: cannot read"));
    }
}
