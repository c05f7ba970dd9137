//! The packages `make package` builds: lintian and rpmlint clean, their metadata and contents,
//! and the .deb installed on this machine, run and purged.
//!
//! Every test but the first needs the packages, so they are `#[ignore]`d in a plain `cargo test`
//! and run by `make test-package` (part of `make test`), which builds the packages first and
//! names them in `VERWALTER_DEB` and `VERWALTER_RPM`. A test whose tool is missing (lintian,
//! rpmlint, rpm, dpkg, systemd-analyze: `make package-deps` installs them as root) or that needs
//! root says why on stderr and passes without checking: that only happens off CI.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use verwalter::config::{Config, RunArgs};

use crate::util::*;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The package named in `var` (set by `make test-package`), else the path `make package` uses.
fn package(var: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| match var {
            "VERWALTER_DEB" => repo_file(&format!("target/verwalter_{VERSION}_amd64.deb")),
            _ => repo_file(&format!("target/verwalter-{VERSION}-1.x86_64.rpm")),
        });
    let path = if path.is_absolute() {
        path
    } else {
        repo_file(path.to_str().unwrap())
    };
    assert!(
        path.is_file(),
        "{} is missing: run `make package`",
        path.display()
    );
    path
}

/// Whether `tool` is on the PATH; if not, says which test is skipped and why.
fn have(tool: &str, test: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED {test}: `{tool}` is missing (`make package-deps` installs it as root)");
    }
    found
}

/// Runs `program args`, which must succeed; its stdout.
fn stdout_of(program: &str, args: &[&str]) -> String {
    let out = output_of(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn output_of(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

/// The packaged settings file is what an operator starts with: it must load as it is, beside
/// the token the package made at install, and give a listen address other nodes can reach.
#[test]
fn packaged_settings_file_loads_and_listens_for_a_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let settings = installed_settings(tmp.path());
    let args = RunArgs {
        settings: Some(settings),
        override_machine_id: Some(MACHINE_ID.into()),
        hostname: Some("alpha".into()),
        ..RunArgs::default()
    };
    let config = Config::load(&args).unwrap_or_else(|e| panic!("{:?}", e.problems));
    assert_eq!(config.host, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    assert_eq!(config.port, 8379);
    assert_eq!(config.config_dir, Path::new("/etc/verwalter"));
    assert_eq!(config.storage_dir, Path::new("/var/lib/verwalter"));
    assert_eq!(config.log_dir, Path::new("/var/log/verwalter"));
    assert!(config.http.token.is_some(), "writes need the token");
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    // The unit's stop timeout covers the longest apply command the file allows by default.
    let unit = std::fs::read_to_string(repo_file("pkg/verwalter.service")).unwrap();
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.strip_suffix('s'))
        .and_then(|v| v.parse().ok())
        .expect("TimeoutStopSec=<n>s in the unit");
    assert!(stop > config.command_timeout.as_secs(), "{stop}");
    assert!(
        unit.contains(
            "ExecStart=/usr/bin/verwalter run --settings /etc/verwalter.d/settings.yaml\n"
        )
    );
}

/// The lines of a maintainer script from the one starting with `first` (after indentation) to
/// the `fi` that closes it, with `/etc/` moved under `root`.
fn script_block(script: &str, first: &str, root: &Path) -> String {
    let mut lines = script
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(first));
    let head = lines
        .next()
        .unwrap_or_else(|| panic!("no {first:?} in\n{script}"));
    let indent = head.len() - head.trim_start().len();
    let mut block = vec![head];
    for line in lines {
        block.push(line);
        if line.len() - line.trim_start().len() == indent && line.trim() == "fi" {
            break;
        }
    }
    block
        .join("\n")
        .replace("/etc/", &format!("{}/etc/", root.display()))
}

/// `pkg/settings.yaml` where the packages install it, beside the API token their install script
/// makes (the script's own lines, run under `root`): the settings file's path.
fn installed_settings(root: &Path) -> PathBuf {
    let dir = root.join("etc/verwalter.d");
    std::fs::create_dir_all(&dir).unwrap();
    let settings = dir.join("settings.yaml");
    std::fs::copy(repo_file("pkg/settings.yaml"), &settings).unwrap();
    let postinst = std::fs::read_to_string(repo_file("pkg/debian/postinst")).unwrap();
    let out = output_of("sh", &["-ec", &script_block(&postinst, "token=", root)]);
    assert!(out.status.success(), "{out:?}");
    settings
}

/// Both packages make the API token at install: 32 random bytes in hex, root's alone (0600),
/// made once and never overwritten; the packaged settings name it, so writes need it from the
/// first start.
#[test]
fn the_packages_make_a_private_api_token_once() {
    use std::os::unix::fs::PermissionsExt;
    for script in ["pkg/debian/postinst", "pkg/rpm/post.sh"] {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("etc/verwalter.d")).unwrap();
        let text = std::fs::read_to_string(repo_file(script)).unwrap();
        let block = script_block(&text, "token=", tmp.path());
        let out = output_of("sh", &["-ec", &block]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{script}: {out:?}");
        let token = tmp.path().join("etc/verwalter.d/api-token");
        assert!(
            said.contains("made the API token for writes"),
            "{script}: {said}"
        );
        assert!(
            said.contains(&format!("sudo cat {}", token.display())),
            "{said}"
        );
        let made = std::fs::read_to_string(&token).unwrap();
        assert_eq!(made.len(), 65, "{script}: {made:?}");
        assert!(
            made.trim_end().bytes().all(|b| b.is_ascii_hexdigit()),
            "{made:?}"
        );
        let mode = std::fs::metadata(&token).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{script}");
        // A second run (an upgrade, a reinstall) keeps it and says nothing.
        let again = output_of("sh", &["-ec", &block]);
        assert!(
            again.status.success() && again.stdout.is_empty(),
            "{again:?}"
        );
        assert_eq!(std::fs::read_to_string(&token).unwrap(), made, "{script}");
    }
}

/// The unit's daemon on the packaged settings and the token made at install: a write without the
/// token is refused from the first start, with it it goes through.
#[test]
fn packaged_settings_refuse_writes_without_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let settings = installed_settings(tmp.path());
    let token = std::fs::read_to_string(settings.with_file_name("api-token")).unwrap();
    let config = tmp.path().join("config");
    copy_tree(&example("minimal"), &config);
    // Flags override the file's `host: 0.0.0.0` and the dirs, as `systemctl edit` would.
    let daemon = Daemon::launch(
        &config,
        &tmp.path().join("storage"),
        &["--settings", settings.to_str().unwrap()],
        &[],
    );
    daemon.wait_json(Duration::from_secs(30), "/v1/schedule", "a schedule", |s| {
        s["hash"].is_string()
    });
    let (code, _) = crate::frontend::request(daemon.port, "POST", "/v1/force_render_all", &[], "");
    assert_eq!(code, 401, "a write without the token");
    let bearer = format!("Authorization: Bearer {}", token.trim());
    let (code, body) =
        crate::frontend::request(daemon.port, "POST", "/v1/force_render_all", &[&bearer], "");
    assert!((200..300).contains(&code), "{code} {body}");
    assert!(daemon.terminate().success());
}

/// A site that keeps its settings file at the top of its config dir (as the packages before
/// 0.14.1 did): the daemon starts and warns that a deploy of the config dir deletes it, and an
/// edit of the file is no input change (no new inputs, same schedule).
#[test]
fn settings_file_in_the_config_dir_is_not_an_input() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config");
    copy_tree(&example("minimal"), &config);
    let settings = config.join("settings.yaml");
    std::fs::copy(repo_file("pkg/settings.yaml"), &settings).unwrap();
    let token = config.join("api-token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Flags override the file's `host: 0.0.0.0` and the dirs, as `systemctl edit` would.
    let daemon = Daemon::launch(
        &config,
        &tmp.path().join("storage"),
        &["--settings", settings.to_str().unwrap()],
        &[],
    );
    let schedule = daemon.wait_json(Duration::from_secs(30), "/v1/schedule", "a schedule", |s| {
        s["hash"].is_string()
    });
    let logs = daemon.logs();
    for what in ["the settings file", "http.token-file"] {
        assert!(
            logs.lines().any(|l| l.contains("WARN")
                && l.contains(what)
                && l.contains("is inside the config dir")),
            "no warning for {what}:\n{logs}"
        );
    }
    let reads = "verwalter_input_reads_total";
    let before = metric(daemon.port, reads).unwrap();
    let changes = |log: &str| log.matches("Inputs changed.").count();
    let changed_before = changes(&daemon.logs());

    let mut text = std::fs::read_to_string(&settings).unwrap();
    text.push_str("# edited\n");
    std::fs::write(&settings, text).unwrap();
    // The watcher saw the edit and read the config dir again...
    wait_for(Duration::from_secs(30), || {
        metric(daemon.port, reads).filter(|n| *n > before)
    })
    .unwrap_or_else(|| panic!("no read after the edit:\n{}", daemon.logs()));
    // ...and found nothing new.
    assert_eq!(changes(&daemon.logs()), changed_before, "{}", daemon.logs());
    assert_eq!(
        daemon.json("/v1/schedule").unwrap()["hash"],
        schedule["hash"]
    );
    assert!(daemon.terminate().success());
}

/// The defaults the packaged settings file shows in its comments (`# port: 8379`) are the ones
/// in force.
#[test]
fn packaged_settings_file_shows_the_real_defaults() {
    let text = std::fs::read_to_string(repo_file("pkg/settings.yaml")).unwrap();
    let defaults = verwalter_controllers::defaults::shown();
    let mut section = String::new();
    let mut checked = Vec::new();
    for line in text.lines() {
        let Some(body) = line.strip_prefix("# ") else {
            continue;
        };
        let nested = body.starts_with("  ");
        let Some((key, rest)) = body.trim_start().split_once(':') else {
            continue;
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
            continue;
        }
        let value = rest.split('#').next().unwrap().trim();
        if value.is_empty() {
            section = key.to_owned();
            continue;
        }
        let key = if nested {
            format!("{section}.{key}")
        } else {
            key.to_owned()
        };
        if let Some(default) = defaults.iter().find(|d| d.key == key) {
            assert_eq!(
                value, default.value,
                "pkg/settings.yaml shows {key}: {value}"
            );
            checked.push(key);
        }
    }
    for key in [
        "port",
        "config-dir",
        "storage-dir",
        "log-dir",
        "cantal-url",
        "render.command-timeout-secs",
        "datacenters.period-ms",
        "datacenters.traffic-cap-bytes",
    ] {
        assert!(
            checked.iter().any(|k| k == key),
            "{key} not found in {checked:?}"
        );
    }
}

#[test]
#[ignore = "needs the packages: run `make test-package`"]
fn deb_is_lintian_clean() {
    let deb = package("VERWALTER_DEB");
    if !have("lintian", "deb_is_lintian_clean") {
        return;
    }
    // Errors, warnings and infos all count; overrides (pkg/debian/lintian-overrides, each with
    // its reason) are the only way past one, but for the tags `VERWALTER_LINTIAN_SUPPRESS` names:
    // `make test` packages its debug build, which lintian finds without fortified C calls
    // (hardening-no-fortify-functions); `make test-package` checks the shipped build with none.
    let suppress = std::env::var("VERWALTER_LINTIAN_SUPPRESS").unwrap_or_default();
    let mut args = vec![
        "--fail-on",
        "error,warning,info",
        "--display-info",
        "--tag-display-limit",
        "0",
    ];
    if !suppress.is_empty() {
        args.extend(["--suppress-tags", suppress.as_str()]);
    }
    args.push(deb.to_str().unwrap());
    let out = output_of("lintian", &args);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && report.trim().is_empty(),
        "lintian: {}\n{report}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs the packages: run `make test-package`"]
fn rpm_is_rpmlint_clean() {
    let rpm = package("VERWALTER_RPM");
    if !have("rpmlint", "rpm_is_rpmlint_clean") {
        return;
    }
    // Settings and filters, each with its reason: pkg/rpm/rpmlint.toml.
    let config = repo_file("pkg/rpm/rpmlint.toml");
    let out = output_of(
        "rpmlint",
        &["-c", config.to_str().unwrap(), rpm.to_str().unwrap()],
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && report.contains(" 0 errors, 0 warnings"),
        "rpmlint: {}\n{report}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Paths every package holds (and, with `dpkg-deb -c`, their modes).
const SHIPPED: &[&str] = &[
    "/usr/bin/verwalter",
    "/etc/verwalter.d/settings.yaml",
    "/usr/share/man/man1/verwalter.1.gz",
    "/usr/share/man/man1/verwalter-run.1.gz",
    "/usr/share/man/man1/verwalter-check.1.gz",
    "/usr/share/man/man1/verwalter-schedule.1.gz",
    "/usr/share/man/man1/verwalter-render.1.gz",
    "/usr/share/man/man1/verwalter-extender.1.gz",
    "/usr/share/man/man1/verwalter-graph.1.gz",
    "/usr/share/bash-completion/completions/verwalter",
    "/usr/share/fish/vendor_completions.d/verwalter.fish",
    "/usr/share/doc/verwalter/running.md",
    "/usr/share/doc/verwalter/packaging.md",
];

#[test]
#[ignore = "needs the packages: run `make test-package`"]
fn deb_metadata_and_contents() {
    let deb = package("VERWALTER_DEB");
    if !have("dpkg-deb", "deb_metadata_and_contents") {
        return;
    }
    let deb = deb.to_str().unwrap();
    let info = stdout_of("dpkg-deb", &["-I", deb]);
    for field in [
        "Package: verwalter\n",
        &format!("Version: {VERSION}\n"),
        "Architecture: amd64\n",
        "Section: admin\n",
        "Homepage: https://github.com/verwalter/verwalter\n",
        "Description: Node daemon that keeps a cluster's services configured",
    ] {
        assert!(info.contains(field), "no {field:?} in\n{info}");
    }
    // Dependencies computed from the binary: glibc, nothing else a node has to install.
    let depends = info
        .lines()
        .find_map(|l| l.strip_prefix(" Depends: "))
        .unwrap_or_else(|| {
            panic!("no Depends (cargo-deb computes it with dpkg-shlibdeps, from dpkg-dev):\n{info}")
        });
    assert!(depends.starts_with("libc6 (>= 2."), "{depends}");
    let conffiles = stdout_of("dpkg-deb", &["-I", deb, "conffiles"]);
    assert_eq!(conffiles.trim(), "/etc/verwalter.d/settings.yaml");
    // 0.13's separate renderer goes: rendering runs inside the daemon.
    assert!(
        info.contains(" Breaks: verwalter-render (<< 0.14)\n"),
        "{info}"
    );
    assert!(
        info.contains(" Replaces: verwalter-render (<< 0.14)\n"),
        "{info}"
    );
    let postinst = stdout_of("dpkg-deb", &["-I", deb, "postinst"]);
    assert!(postinst.contains("install -d -o root -g root -m 0700 /var/lib/verwalter"));
    assert!(postinst.contains("deb-systemd-helper enable verwalter.service"));
    // The settings file moved out of the config dir: dpkg carries an edited one over.
    let mv_conffile = "dpkg-maintscript-helper mv_conffile /etc/verwalter/settings.yaml";
    for script in ["preinst", "postinst", "postrm"] {
        let text = stdout_of("dpkg-deb", &["-I", deb, script]);
        assert!(text.contains(mv_conffile), "{script}:\n{text}");
    }

    let listing = stdout_of("dpkg-deb", &["-c", deb]);
    let entry = |path: &str| {
        listing
            .lines()
            .find(|l| l.ends_with(&format!(".{path}")))
            .unwrap_or_else(|| panic!("{path} is not in the .deb:\n{listing}"))
            .to_owned()
    };
    for path in SHIPPED.iter().chain(&[
        "/usr/share/zsh/vendor-completions/_verwalter",
        "/usr/share/doc/verwalter/changelog.gz",
        "/usr/share/doc/verwalter/copyright",
        "/usr/lib/systemd/system/verwalter.service",
    ]) {
        // Owned by root (cargo-deb writes ids without names).
        assert!(entry(path).contains(" 0/0 "), "{}", entry(path));
    }
    assert!(entry("/usr/bin/verwalter").starts_with("-rwxr-xr-x"));
    assert!(entry("/etc/verwalter.d/settings.yaml").starts_with("-rw-r--r--"));
    // The hidden generator is not documented: no page for it.
    assert!(!listing.contains("verwalter-generate"), "{listing}");
}

#[test]
#[ignore = "needs the packages: run `make test-package`"]
fn rpm_metadata_and_contents() {
    let rpm = package("VERWALTER_RPM");
    if !have("rpm", "rpm_metadata_and_contents") {
        return;
    }
    let rpm = rpm.to_str().unwrap();
    let query = |format: &str| stdout_of("rpm", &["-qp", "--qf", format, rpm]);
    assert_eq!(
        query("%{NAME} %{VERSION} %{RELEASE} %{ARCH}\n%{LICENSE}\n%{URL}\n"),
        format!(
            "verwalter {VERSION} 1 x86_64\nMIT OR Apache-2.0\nhttps://github.com/verwalter/verwalter\n"
        )
    );
    assert_eq!(
        query("%{SUMMARY}"),
        "Node daemon that keeps a cluster's services configured"
    );
    let files = stdout_of("rpm", &["-qpl", rpm]);
    for path in SHIPPED.iter().chain(&[
        "/usr/share/zsh/site-functions/_verwalter",
        "/usr/share/doc/verwalter/changelog",
        "/usr/lib/systemd/system/verwalter.service",
    ]) {
        assert!(
            files.lines().any(|l| l == *path),
            "{path} is not in the .rpm:\n{files}"
        );
    }
    // Modes, owners and flags (c: config, n: noreplace; d: doc).
    let modes = query(
        "[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILEFLAGS:fflags} %{FILENAMES}\n]",
    );
    for line in [
        "-rwxr-xr-x root:root  /usr/bin/verwalter",
        "-rw-r--r-- root:root cn /etc/verwalter.d/settings.yaml",
        "-rw-r--r-- root:root d /usr/share/man/man1/verwalter.1.gz",
    ] {
        assert!(modes.lines().any(|l| l == line), "no {line:?} in\n{modes}");
    }
    let requires = stdout_of("rpm", &["-qp", "--requires", rpm]);
    assert!(requires.contains("libc.so.6(GLIBC_2."), "{requires}");
    let scripts = stdout_of("rpm", &["-qp", "--scripts", rpm]);
    assert!(
        scripts.contains("install -d -o root -g root -m 0700 /var/lib/verwalter"),
        "{scripts}"
    );
    assert!(
        scripts.contains("systemctl --no-reload preset verwalter.service"),
        "{scripts}"
    );
    assert!(
        scripts.contains("systemctl try-restart verwalter.service"),
        "{scripts}"
    );
    assert!(scripts.contains("/etc/verwalter.d/api-token"), "{scripts}");
    assert!(
        scripts.contains("posttrans scriptlet") && scripts.contains("settings.yaml.rpmsave"),
        "{scripts}"
    );
    let obsoletes = stdout_of("rpm", &["-qp", "--obsoletes", rpm]);
    assert_eq!(obsoletes.trim(), "verwalter-render < 0.14");
}

#[test]
#[ignore = "needs the packages: run `make test-package`"]
fn rpm_installs_into_a_scratch_root() {
    const TEST: &str = "rpm_installs_into_a_scratch_root";
    let rpm = package("VERWALTER_RPM");
    if !have("rpm", TEST) {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED {TEST}: rpm sets file owners, which needs root");
        return;
    }
    // Its own database under a temp root: no dependencies there (--nodeps), and no scriptlets,
    // which would run inside that root.
    let root = tempfile::tempdir().unwrap();
    let root_arg = root.path().to_str().unwrap();
    stdout_of("rpm", &["--root", root_arg, "--initdb"]);
    stdout_of(
        "rpm",
        &[
            "--root",
            root_arg,
            "-i",
            "--nodeps",
            "--noscripts",
            rpm.to_str().unwrap(),
        ],
    );
    // Every file as the package says (digest, mode, owner).
    assert_eq!(
        stdout_of("rpm", &["--root", root_arg, "-V", "--nodeps", "verwalter"]),
        ""
    );
    let bin = root.path().join("usr/bin/verwalter");
    assert_eq!(
        stdout_of(bin.to_str().unwrap(), &["--version"]).trim(),
        format!("verwalter {VERSION}")
    );
    let unit =
        std::fs::read_to_string(root.path().join("usr/lib/systemd/system/verwalter.service"))
            .unwrap();
    assert_eq!(
        unit,
        std::fs::read_to_string(repo_file("pkg/verwalter.service")).unwrap()
    );
}

/// Removes a file when the test ends, however it ends.
struct Removed<'a>(&'a Path);

impl Drop for Removed<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Purges the package when the install test ends, however it ends.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "verwalter"]).output();
    }
}

#[test]
#[ignore = "needs the packages: run `make test-package`"]
fn deb_installs_runs_and_purges() {
    const TEST: &str = "deb_installs_runs_and_purges";
    let deb = package("VERWALTER_DEB");
    if !have("dpkg", TEST) || !have("systemd-analyze", TEST) || !have("man", TEST) {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED {TEST}: installing a package needs root");
        return;
    }
    // Never touch a real installation (its stored schedule would go with the purge).
    let status = output_of("dpkg-query", &["-W", "-f", "${Status}", "verwalter"]);
    if String::from_utf8_lossy(&status.stdout).contains("installed")
        || Path::new("/var/lib/verwalter").exists()
    {
        eprintln!(
            "SKIPPED {TEST}: verwalter is installed here, or /var/lib/verwalter exists: not touching it"
        );
        return;
    }

    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let installed = Installed;
    // An upgrade from a package that kept the settings in the config dir (0.14.0's layout: a
    // stand-in package holding only that conffile), with the site's edits in it, and a unit of
    // the site's own (as 0.13 sites wrote) that would override the packaged one.
    let old = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(old.path().join("DEBIAN")).unwrap();
    std::fs::create_dir_all(old.path().join("etc/verwalter")).unwrap();
    std::fs::write(
        old.path().join("DEBIAN/control"),
        "Package: verwalter\nVersion: 0.14.0\nArchitecture: amd64\n\
         Maintainer: test <test@example.com>\nDescription: the settings layout of 0.14.0\n",
    )
    .unwrap();
    std::fs::write(
        old.path().join("DEBIAN/conffiles"),
        "/etc/verwalter/settings.yaml\n",
    )
    .unwrap();
    std::fs::copy(
        repo_file("pkg/settings.yaml"),
        old.path().join("etc/verwalter/settings.yaml"),
    )
    .unwrap();
    let old_deb = old.path().with_extension("deb");
    stdout_of(
        "dpkg-deb",
        &[
            "--build",
            old.path().to_str().unwrap(),
            old_deb.to_str().unwrap(),
        ],
    );
    stdout_of("dpkg", &["-i", old_deb.to_str().unwrap()]);
    let edited = "host: 0.0.0.0\nport: 8390\n";
    std::fs::write("/etc/verwalter/settings.yaml", edited).unwrap();
    let site_unit = Path::new("/etc/systemd/system/verwalter.service");
    let _site_unit = (!site_unit.exists()).then(|| {
        std::fs::write(
            site_unit,
            "[Service]\nExecStart=/usr/bin/verwalter --host 0.0.0.0\n",
        )
        .unwrap();
        Removed(site_unit)
    });

    let out = output_of("dpkg", &["-i", deb.to_str().unwrap()]);
    let (said, warned) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{said}{warned}");
    assert_eq!(
        stdout_of("/usr/bin/verwalter", &["--version"]).trim(),
        format!("verwalter {VERSION}")
    );
    // The edited settings moved out of the config dir, as they were.
    assert_eq!(
        std::fs::read_to_string("/etc/verwalter.d/settings.yaml").unwrap(),
        edited
    );
    assert!(!Path::new("/etc/verwalter/settings.yaml").exists());
    // The token made once, root's alone; a settings file without `token-file` and the site's
    // unit are pointed out.
    let token = std::fs::metadata("/etc/verwalter.d/api-token").unwrap();
    assert_eq!(
        (token.uid(), token.permissions().mode() & 0o777),
        (0, 0o600)
    );
    assert!(said.contains("made the API token for writes"), "{said}");
    assert!(warned.contains("names no http.token-file"), "{warned}");
    assert!(
        warned.contains("/etc/systemd/system/verwalter.service overrides the packaged unit"),
        "{warned}"
    );

    // The dirs postinst made, with their owners and modes.
    let storage = std::fs::metadata("/var/lib/verwalter").unwrap();
    assert_eq!(
        (
            storage.uid(),
            storage.gid(),
            storage.permissions().mode() & 0o7777
        ),
        (0, 0, 0o700)
    );
    let log = std::fs::metadata("/var/log/verwalter").unwrap();
    let adm = nix::unistd::Group::from_name("adm")
        .unwrap()
        .unwrap()
        .gid
        .as_raw();
    assert_eq!(
        (log.uid(), log.gid(), log.permissions().mode() & 0o7777),
        (0, adm, 0o2750)
    );

    // The package ships no config (as 0.13): `check` says what is missing.
    let out = output_of(
        "/usr/bin/verwalter",
        &["check", "--config-dir", "/etc/verwalter"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("/etc/verwalter: scheduler/v1/main.lua: missing"),
        "{stderr}"
    );
    // With a config dir deployed beside the settings file, the installed binary runs its
    // scheduler; the settings file is not taken for an input.
    for dir in ["scheduler", "runtime", "templates"] {
        copy_tree(
            &example("minimal").join(dir),
            &Path::new("/etc/verwalter").join(dir),
        );
    }
    let out = output_of(
        "/usr/bin/verwalter",
        &[
            "check",
            "--config-dir",
            "/etc/verwalter",
            "--hostname",
            "alpha",
        ],
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    for dir in ["scheduler", "runtime", "templates"] {
        std::fs::remove_dir_all(Path::new("/etc/verwalter").join(dir)).unwrap();
    }
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("/etc/verwalter: ok; the scheduler returned a schedule"),
        "{stdout}"
    );

    assert_eq!(
        stdout_of("man", &["-w", "verwalter"]).trim(),
        "/usr/share/man/man1/verwalter.1.gz"
    );
    let page = stdout_of("man", &["-P", "cat", "verwalter-run"]);
    assert!(page.contains("--settings"), "{page}");
    let bash = stdout_of(
        "bash",
        &[
            "-c",
            ". /usr/share/bash-completion/completions/verwalter && complete -p verwalter",
        ],
    );
    assert!(bash.contains("verwalter"), "{bash}");

    // systemd reports unit file problems as warnings with exit status 0: stderr must be empty.
    let unit = stdout_of("dpkg", &["-L", "verwalter"])
        .lines()
        .find(|l| l.ends_with("/systemd/system/verwalter.service"))
        .expect("the unit is installed")
        .to_owned();
    let out = output_of("systemd-analyze", &["verify", &unit]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "{}: {stderr}",
        out.status
    );

    drop(installed);
    for gone in [
        "/usr/bin/verwalter",
        "/etc/verwalter",
        "/etc/verwalter.d",
        "/var/lib/verwalter",
        "/var/log/verwalter",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is left after the purge");
    }
}
