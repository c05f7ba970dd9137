//! Tests of the apply commands, with real files in temp dirs and real processes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::command::root_argv;
use super::*;

/// Collects what the commands log.
#[derive(Debug, Default)]
struct Collect {
    lines: Vec<String>,
    output: Vec<u8>,
    external: Vec<(String, u64)>,
}

impl ApplyLog for Collect {
    fn line(&mut self, text: &str) {
        self.lines.push(text.to_owned());
    }
    fn output(&mut self, bytes: &[u8]) {
        self.output.extend_from_slice(bytes);
    }
    fn external_log(&mut self, path: &str, offset: u64) {
        self.external.push((path.to_owned(), offset));
    }
}

impl Collect {
    fn text(&self) -> String {
        self.lines.join("\n")
    }
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }
}

/// A temp dir with rendered files under `staging/`, and the context to run commands in it.
struct Env {
    tmp: tempfile::TempDir,
    files: BTreeMap<String, PathBuf>,
    log_dirs: BTreeMap<String, PathBuf>,
    timeout: Duration,
    dry_run: bool,
    role: String,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("staging")).unwrap();
        Env {
            tmp,
            files: BTreeMap::new(),
            log_dirs: BTreeMap::new(),
            // Generous: no test should get near it unless it tests the timeout.
            timeout: Duration::from_secs(60),
            dry_run: false,
            role: "web".into(),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn write(&self, rel: &str, content: &str) -> PathBuf {
        let path = self.p(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, content).unwrap();
        path
    }

    fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.p(rel)).unwrap()
    }

    fn exists(&self, rel: &str) -> bool {
        fs::symlink_metadata(self.p(rel)).is_ok()
    }

    /// A rendered template `name`, available as `{{ files.name }}`.
    fn render(&mut self, name: &str, content: &str) -> PathBuf {
        let path = self.write(&format!("staging/{name}"), content);
        self.files.insert(name.to_owned(), path.clone());
        path
    }

    /// Commands from YAML, with `$T` standing for the temp dir.
    fn commands(&self, yaml: &str) -> Vec<Command> {
        let yaml = yaml.replace("$T", self.tmp.path().to_str().unwrap());
        serde_norway::from_str(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
    }

    async fn run(&self, yaml: &str) -> (Result<(), CommandError>, Collect) {
        let commands = self.commands(yaml);
        self.run_list(&commands).await
    }

    async fn run_list(&self, commands: &[Command]) -> (Result<(), CommandError>, Collect) {
        let ctx = Context {
            role: &self.role,
            files: &self.files,
            log_dirs: &self.log_dirs,
            timeout: self.timeout,
            dry_run: self.dry_run,
        };
        let mut log = Collect::default();
        let result = run_commands(commands, &ctx, &mut log).await;
        (result, log)
    }

    fn names_in(&self, rel: &str) -> BTreeSet<String> {
        fs::read_dir(self.p(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    }
}

fn parse(yaml: &str) -> Result<Vec<Command>, String> {
    serde_norway::from_str(yaml).map_err(|e| e.to_string())
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Whether the process is gone (a zombie counts: it was killed, nobody reaped it yet).
fn gone(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Polls until the process is gone, for at most a few seconds; real processes take their time.
async fn wait_gone(pid: i32) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if gone(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gone(pid)
}

fn read_pid(path: &Path) -> i32 {
    fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

// ---- YAML ----------------------------------------------------------------------------------

#[test]
fn every_tag_parses_with_dash_or_underscore_keys() {
    let commands = parse(
        r#"
- !Cmd [echo, "{{ role }}"]
- !Sh "echo hi"
- !RootCommand [systemctl, reload, nginx]
- !Copy {src: "{{ files.a }}", dest: /etc/a.conf, mode: 0o600}
- !Copy {src: "{{ files.a }}", dest: /etc/b.conf}
- !SplitText {section: "^## (.*)$", validate: "[a-z]+", src: "{{ files.s }}", dest: "/etc/s/(*).conf", mode: 420}
- !CleanFiles {pattern: "/etc/s/(*).conf", keep-list: "{{ files.k }}"}
- !CleanFiles {pattern: "/etc/s/(*).conf", keep_list: "{{ files.k }}"}
- !Condition
  dirs-changed: [/etc/nginx]
  commands:
  - !Cmd [nginx, -s, reload]
- !Condition {dirs_changed: [/etc/a, /etc/b], commands: []}
- !PeekLog "app/current.log"
"#,
    )
    .unwrap();
    let clean = CleanFiles {
        pattern: "/etc/s/(*).conf".into(),
        keep_list: "{{ files.k }}".into(),
    };
    assert_eq!(
        commands,
        vec![
            Command::Cmd(vec!["echo".into(), "{{ role }}".into()]),
            Command::Sh("echo hi".into()),
            Command::RootCommand(vec!["systemctl".into(), "reload".into(), "nginx".into()]),
            Command::Copy(Copy {
                src: "{{ files.a }}".into(),
                dest: "/etc/a.conf".into(),
                mode: Some(0o600),
            }),
            Command::Copy(Copy {
                src: "{{ files.a }}".into(),
                dest: "/etc/b.conf".into(),
                mode: None,
            }),
            Command::SplitText(SplitText {
                section: "^## (.*)$".into(),
                validate: "[a-z]+".into(),
                src: "{{ files.s }}".into(),
                dest: "/etc/s/(*).conf".into(),
                mode: Some(0o644),
            }),
            Command::CleanFiles(clean.clone()),
            Command::CleanFiles(clean),
            Command::Condition(Condition {
                dirs_changed: vec!["/etc/nginx".into()],
                commands: vec![Command::Cmd(vec![
                    "nginx".into(),
                    "-s".into(),
                    "reload".into(),
                ])],
            }),
            Command::Condition(Condition {
                dirs_changed: vec!["/etc/a".into(), "/etc/b".into()],
                commands: vec![],
            }),
            Command::PeekLog("app/current.log".into()),
        ]
    );
}

#[test]
fn unknown_keys_and_missing_src_are_rejected() {
    // The example of the 0.13 docs used `target:`; it must fail, naming the key.
    let err = parse("- !Copy {src: a, target: /etc/x}").unwrap_err();
    assert!(err.contains("unknown field `target`"), "{err}");
    let err = parse("- !Condition {dirs-changed: [], commands: [], when: x}").unwrap_err();
    assert!(err.contains("`when`"), "{err}");
    let err = parse("- !Copy {dest: /etc/x}").unwrap_err();
    assert!(err.contains("missing field `src`"), "{err}");
    let err = parse("- !Shell \"echo\"").unwrap_err();
    assert!(err.contains("Shell"), "{err}");
}

#[test]
fn mode_is_read_as_octal_where_meant() {
    let mode = |text: &str| {
        parse(&format!("- !Copy {{src: a, dest: /b, mode: {text}}}")).map(|c| match &c[0] {
            Command::Copy(copy) => copy.mode,
            other => panic!("{other:?}"),
        })
    };
    assert_eq!(mode("0o640"), Ok(Some(0o640)));
    assert_eq!(mode("416"), Ok(Some(0o640)));
    assert_eq!(
        mode("0640"),
        Ok(Some(0o640)),
        "chmod style, as in 0.13 configs"
    );
    assert!(mode("0o17777").unwrap_err().contains("more than 0o777"));
    let slip = mode("644").unwrap_err();
    assert!(
        slip.contains("mode 644 is 0o1204") && slip.contains("write 0644 or 0o644"),
        "{slip}"
    );
    assert!(mode("0o4755").is_err(), "no setuid on rendered files");
    assert!(
        mode("\"640\"").is_err(),
        "a string without a leading 0 is not a mode"
    );
    assert!(mode("-1").is_err());
}

// ---- Substitution --------------------------------------------------------------------------

#[tokio::test]
async fn role_and_files_are_substituted_in_arguments() {
    let mut env = Env::new();
    let main = env.render("main", "x");
    let (result, log) = env
        .run(r#"- !Cmd [echo, "{{role}}", "{{ files.main }}", "<{{  role  }}>"]"#)
        .await;
    result.unwrap();
    assert_eq!(log.out(), format!("web {} <web>\n", main.display()));
}

#[tokio::test]
async fn unknown_variable_fails_before_anything_runs() {
    let mut env = Env::new();
    env.render("main", "x");
    let (result, log) = env
        .run(
            r#"
- !Cmd [touch, "$T/marker"]
- !Cmd [echo, "{{ files.mian }}"]
"#,
        )
        .await;
    let err = result.unwrap_err();
    assert!(
        matches!(err, CommandError::UnknownVariable { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("command 2 (!Cmd): unknown variable {{ files.mian }}"),
        "{text}"
    );
    assert!(!env.exists("marker"), "the first command must not have run");
    assert!(log.lines.is_empty(), "{:?}", log.lines);
}

#[tokio::test]
async fn hostile_values_stay_literal_in_the_shell() {
    let mut env = Env::new();
    let t = env.tmp.path().display().to_string();
    // Each starts with the temp dir, so that even a broken quoting writes nowhere else.
    let hostile = [
        format!("{t}/a$(touch {t}/m1)"),
        format!("{t}/b`touch {t}/m2`"),
        format!("{t}/c; touch {t}/m3"),
        format!("{t}/d'; touch {t}/m4; '"),
        format!("{t}/e\"$(touch {t}/m5)\""),
    ];
    for (i, value) in hostile.iter().enumerate() {
        // The values stand for paths; no such file needs to exist.
        env.files.insert(format!("v{i}"), PathBuf::from(value));
    }
    let (result, log) = env
        .run(
            r#"
- !Sh "printf '%s\n' {{ files.v0 }} {{ files.v1 }} {{ files.v2 }} {{ files.v3 }} {{ files.v4 }}"
- !Cmd [printf, "%s\n", "{{ files.v0 }}", "{{ files.v3 }}"]
"#,
        )
        .await;
    result.unwrap();
    for marker in ["m1", "m2", "m3", "m4", "m5"] {
        assert!(!env.exists(marker), "{marker} was created: a value was run");
    }
    let out = log.out();
    for value in &hostile {
        assert!(
            out.contains(&format!("{value}\n")),
            "{value} not literal in {out}"
        );
    }
}

// ---- Processes -----------------------------------------------------------------------------

#[tokio::test]
async fn output_of_both_streams_is_captured_and_the_run_logged() {
    let env = Env::new();
    let (result, log) = env
        .run(r#"- !Cmd [sh, -c, "echo to-out; echo to-err >&2"]"#)
        .await;
    result.unwrap();
    let out = log.out();
    assert!(
        out.contains("to-out\n") && out.contains("to-err\n"),
        "{out}"
    );
    assert_eq!(
        log.lines[0],
        "running: sh -c 'echo to-out; echo to-err >&2'"
    );
    assert!(
        log.lines[1].starts_with("exited with status 0 after "),
        "{:?}",
        log.lines
    );
}

#[tokio::test]
async fn non_zero_exit_fails_and_stops_the_rest() {
    let env = Env::new();
    let (result, log) = env
        .run(
            r#"
- !Cmd ["true"]
- !Cmd [sh, -c, "exit 3"]
- !Cmd [touch, "$T/marker"]
"#,
        )
        .await;
    let err = result.unwrap_err();
    assert!(matches!(err, CommandError::Failed { .. }), "{err:?}");
    assert_eq!(err.to_string(), "command 2 (!Cmd): sh exited with status 3");
    assert_eq!(err.at().index, 2);
    assert_eq!(err.label(), "failed");
    assert!(!env.exists("marker"));
    assert!(log.text().contains("exited with status 3"));
}

#[tokio::test]
async fn the_error_carries_the_last_line_the_command_wrote() {
    let env = Env::new();
    let (result, _) = env
        .run(r#"- !Sh "echo progress; echo 'bad config: line 3' >&2; exit 1""#)
        .await;
    let err = result.unwrap_err().to_string();
    assert_eq!(
        err, "command 1 (!Sh): /bin/sh exited with status 1: bad config: line 3",
        "the sh -x trace is skipped"
    );
    let (result, _) = env
        .run(r#"- !Cmd [sh, -c, "echo only stdout; exit 2"]"#)
        .await;
    assert!(
        result
            .unwrap_err()
            .to_string()
            .ends_with("status 2: only stdout")
    );
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_error() {
    let env = Env::new();
    let (result, _) = env.run("- !Cmd [no-such-program-here, x]").await;
    let err = result.unwrap_err();
    assert!(matches!(err, CommandError::Spawn { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("command 1 (!Cmd): cannot start no-such-program-here: "),
        "{err}"
    );
    // For !Cmd the program name is taken as written, placeholders and all.
    let (result, _) = env.run(r#"- !Cmd ["{{ role }}"]"#).await;
    assert!(result.unwrap_err().to_string().contains("{{ role }}"));
}

#[tokio::test]
async fn timeout_kills_the_process_and_its_group() {
    let mut env = Env::new();
    env.timeout = Duration::from_millis(300);
    let pid_file = env.render("pid", "");
    let (result, log) = env.run(r#"- !Cmd [sleep, "30"]"#).await;
    let err = result.unwrap_err();
    assert!(matches!(err, CommandError::Timeout { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "command 1 (!Cmd): sleep killed after timeout of 300ms"
    );
    assert!(log.text().contains("killed after timeout of 300ms"));

    // A background process the command started goes with it.
    let (result, _) = env
        .run(r#"- !Sh "sleep 30 & echo $! > {{ files.pid }}; wait""#)
        .await;
    assert!(matches!(result, Err(CommandError::Timeout { .. })));
    let grandchild = read_pid(&pid_file);
    assert!(wait_gone(grandchild).await, "grandchild {grandchild} alive");
}

#[tokio::test]
async fn a_background_process_keeping_the_output_open_does_not_hold_the_run() {
    let mut env = Env::new();
    let pid_file = env.render("pid", "");
    // The limit is far away: reaching it would be the failure here.
    let (result, log) = env
        .run(r#"- !Sh "sleep 30 & echo $! > {{ files.pid }}; echo started""#)
        .await;
    let daemon = read_pid(&pid_file);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon),
        nix::sys::signal::SIGKILL,
    );
    result.unwrap();
    assert!(log.out().contains("started\n"));
    assert!(log.text().contains("output still open after exit"));
}

#[tokio::test]
async fn a_dropped_run_kills_its_process() {
    let mut env = Env::new();
    let pid_file = env.render("pid", "");
    let commands = env.commands(r#"- !Sh "echo $$ > {{ files.pid }}; exec sleep 30""#);
    let ctx = Context {
        role: "web",
        files: &env.files,
        log_dirs: &env.log_dirs,
        timeout: env.timeout,
        dry_run: false,
    };
    let mut log = Collect::default();
    // Boxed, so that `drop` below drops the future itself.
    let mut run = Box::pin(run_commands(&commands, &ctx, &mut log));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        tokio::select! {
            result = &mut run => panic!("finished early: {result:?}"),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let written = fs::read_to_string(&pid_file).unwrap_or_default();
        if written.ends_with('\n') {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started"
        );
    }
    let pid = read_pid(&pid_file);
    drop(run);
    assert!(wait_gone(pid).await, "process {pid} outlived its run");
}

#[tokio::test]
async fn sh_stops_at_the_first_failure_and_traces() {
    let env = Env::new();
    let (result, log) = env
        .run("- !Sh |\n    echo one\n    false\n    echo two\n")
        .await;
    let err = result.unwrap_err();
    assert_eq!(
        err.to_string(),
        "command 1 (!Sh): /bin/sh exited with status 1"
    );
    let out = log.out();
    assert!(out.contains("one\n") && out.contains("+ false"), "{out}");
    assert!(!out.contains("two\n"), "{out}");
}

#[tokio::test]
async fn root_command_uses_sudo_only_when_not_root() {
    let argv = vec!["lithos_switch".to_string(), "web".to_string()];
    assert_eq!(
        root_argv(argv.clone(), false),
        ["/usr/bin/sudo", "-n", "lithos_switch", "web"]
    );
    assert_eq!(root_argv(argv.clone(), true), argv);
    if nix::unistd::geteuid().is_root() {
        let env = Env::new();
        // Unlike !Cmd, the program is expanded too.
        let (result, log) = env
            .run(r#"- !RootCommand ["ech{{ role }}", "{{ role }}"]"#)
            .await;
        assert!(
            result
                .unwrap_err()
                .to_string()
                .contains("cannot start echweb")
        );
        assert!(log.text().contains("running: echweb web"));
        let (result, log) = env.run(r#"- !RootCommand [echo, "{{ role }}"]"#).await;
        result.unwrap();
        assert_eq!(log.out(), "web\n");
    }
}

// ---- !Copy ---------------------------------------------------------------------------------

#[tokio::test]
async fn copy_replaces_the_file_with_its_mode_and_leaves_no_temp() {
    let mut env = Env::new();
    env.render("a", "new content\n");
    env.write("etc/a.conf", "old");
    let outside = env.write("outside", "precious");
    // A leftover temp file that is a symlink must be replaced, never written through.
    symlink(&outside, env.p("etc/.tmp.a.conf")).unwrap();
    let (result, log) = env
        .run(
            r#"
- !Copy {src: "{{ files.a }}", dest: "$T/etc/a.conf", mode: 0o600}
- !Copy {src: "{{ files.a }}", dest: "$T/etc/b.conf"}
"#,
        )
        .await;
    result.unwrap();
    assert_eq!(env.read("etc/a.conf"), "new content\n");
    assert_eq!(mode_of(&env.p("etc/a.conf")), 0o600);
    assert_eq!(env.read("etc/b.conf"), "new content\n");
    assert_eq!(mode_of(&env.p("etc/b.conf")), 0o644);
    assert_eq!(env.read("outside"), "precious");
    assert_eq!(env.names_in("etc"), names(&["a.conf", "b.conf"]));
    assert!(log.text().contains("copying "), "{:?}", log.lines);
}

#[tokio::test]
async fn copy_reports_missing_source_and_destination_dir() {
    let mut env = Env::new();
    env.files.insert("gone".into(), env.p("staging/gone"));
    env.render("a", "x");
    let (result, _) = env
        .run(r#"- !Copy {src: "{{ files.gone }}", dest: "$T/a.conf"}"#)
        .await;
    let err = result.unwrap_err();
    assert!(matches!(err, CommandError::MissingFile { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "command 1 (!Copy): source file {} does not exist",
            env.p("staging/gone").display()
        )
    );
    let (result, _) = env
        .run(r#"- !Copy {src: "{{ files.a }}", dest: "$T/no/such/dir/a.conf"}"#)
        .await;
    let text = result.unwrap_err().to_string();
    assert!(text.contains("destination directory"), "{text}");
    assert!(!env.exists("no"));
}

// ---- !SplitText ----------------------------------------------------------------------------

const SPLIT: &str = r#"
- !SplitText
    section: "^## (.*)$"
    validate: "[a-z]+"
    src: "{{ files.sites }}"
    dest: "$T/out/(*).conf"
"#;

#[tokio::test]
async fn split_text_writes_sections_and_removes_stale_files() {
    let mut env = Env::new();
    env.render(
        "sites",
        "\n## alpha\nserver a;\n  listen 80;\n## beta\n## gamma\nserver g;",
    );
    env.write("out/old.conf", "stale");
    env.write("out/alpha.conf", "previous");
    env.write("out/notes.txt", "not matching");
    env.write("out/.hidden.conf", "hidden");
    fs::create_dir(env.p("out/dir.conf")).unwrap();
    let (result, log) = env.run(SPLIT).await;
    result.unwrap();
    assert_eq!(env.read("out/alpha.conf"), "server a;\n  listen 80;\n");
    assert_eq!(env.read("out/beta.conf"), "");
    assert_eq!(env.read("out/gamma.conf"), "server g;");
    assert_eq!(mode_of(&env.p("out/gamma.conf")), 0o644);
    assert_eq!(
        env.names_in("out"),
        names(&[
            "alpha.conf",
            "beta.conf",
            "gamma.conf",
            "notes.txt",
            ".hidden.conf",
            "dir.conf"
        ])
    );
    assert!(log.text().contains("removed "), "{:?}", log.lines);
}

#[tokio::test]
async fn split_text_rejects_unsafe_names_before_writing_anything() {
    for (name, why) in [
        ("../x", "starts with `.`"),
        ("a/b", "contains `/`"),
        ("..", "starts with `.`"),
        ("", "is empty"),
        ("a\tb", "control character"),
    ] {
        let mut env = Env::new();
        env.render("sites", &format!("## ok\nfine\n## {name}\nevil\n"));
        env.write("out/old.conf", "stale");
        let (result, _) = env.run(&SPLIT.replace("[a-z]+", ".*")).await;
        let err = result.unwrap_err();
        assert!(matches!(err, CommandError::BadInput { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("line 3") && text.contains(why), "{text}");
        assert_eq!(env.names_in("out"), names(&["old.conf"]), "for {name:?}");
        assert!(!env.exists("x"));
    }
}

#[tokio::test]
async fn split_text_rejects_bad_content() {
    let cases = [
        ("text\n## a\n", "line 1: text before the first section"),
        (
            "## a\n## ab1\n",
            "line 2: section name \"ab1\" does not match validate",
        ),
        (
            "## a\nx\n## a\n",
            "line 3: section \"a\" again (first on line 1)",
        ),
    ];
    for (content, expected) in cases {
        let mut env = Env::new();
        env.render("sites", content);
        env.write("out/old.conf", "stale");
        let (result, _) = env.run(SPLIT).await;
        let text = result.unwrap_err().to_string();
        assert!(text.contains(expected), "{text}");
        assert_eq!(env.names_in("out"), names(&["old.conf"]));
    }
}

#[tokio::test]
async fn split_text_sets_mode_and_needs_its_source() {
    let mut env = Env::new();
    env.render("sites", "## a\nx\n");
    fs::create_dir(env.p("out")).unwrap();
    let (result, _) = env
        .run(&SPLIT.replace("dest:", "mode: 0o640\n    dest:"))
        .await;
    result.unwrap();
    assert_eq!(mode_of(&env.p("out/a.conf")), 0o640);

    fs::remove_file(env.p("staging/sites")).unwrap();
    let (result, _) = env.run(SPLIT).await;
    let err = result.unwrap_err();
    assert!(matches!(err, CommandError::MissingFile { .. }), "{err:?}");
    assert_eq!(env.read("out/a.conf"), "x\n", "left as it was");
}

// ---- !CleanFiles ---------------------------------------------------------------------------

#[tokio::test]
async fn clean_files_keeps_listed_and_removes_others() {
    let mut env = Env::new();
    env.render("keep", "a\n\n  b  \n");
    for name in ["a.conf", "b.conf", "c.conf", "notes.txt", ".d.conf"] {
        env.write(&format!("sites/{name}"), "x");
    }
    fs::create_dir(env.p("sites/e.conf")).unwrap();
    let (result, log) = env
        .run(r#"- !CleanFiles {pattern: "$T/sites/(*).conf", keep-list: "{{ files.keep }}"}"#)
        .await;
    result.unwrap();
    assert_eq!(
        env.names_in("sites"),
        names(&["a.conf", "b.conf", "notes.txt", ".d.conf", "e.conf"])
    );
    assert!(
        log.text()
            .contains(&format!("removed {}", env.p("sites/c.conf").display())),
        "{:?}",
        log.lines
    );
}

#[tokio::test]
async fn clean_files_double_star_and_symlinks() {
    let mut env = Env::new();
    env.render("keep", "sub/y.conf\n");
    for rel in ["x.conf", "sub/y.conf", "sub/deep/z.conf", "sub/deep/z.txt"] {
        env.write(&format!("dir/{rel}"), "x");
    }
    env.write("outside/victim.conf", "precious");
    env.write("outside/target.conf", "precious");
    symlink(env.p("outside"), env.p("dir/linked")).unwrap();
    symlink(env.p("outside/target.conf"), env.p("dir/link.conf")).unwrap();
    let (result, _) = env
        .run(r#"- !CleanFiles {pattern: "$T/dir/(**/*.conf)", keep_list: "{{ files.keep }}"}"#)
        .await;
    result.unwrap();
    assert!(!env.exists("dir/x.conf"));
    assert!(!env.exists("dir/sub/deep/z.conf"));
    assert!(env.exists("dir/sub/y.conf"));
    assert!(env.exists("dir/sub/deep/z.txt"));
    // The symlink itself is removed; nothing is followed out of the pattern's directory.
    assert!(!env.exists("dir/link.conf"));
    assert!(env.exists("dir/linked"));
    assert_eq!(env.read("outside/victim.conf"), "precious");
    assert_eq!(env.read("outside/target.conf"), "precious");
}

#[tokio::test]
async fn clean_files_needs_its_keep_list() {
    let mut env = Env::new();
    env.files.insert("keep".into(), env.p("staging/keep"));
    env.write("sites/a.conf", "x");
    let (result, _) = env
        .run(r#"- !CleanFiles {pattern: "$T/sites/(*).conf", keep-list: "{{ files.keep }}"}"#)
        .await;
    let text = result.unwrap_err().to_string();
    assert!(
        text.contains("keep list") && text.contains("does not exist"),
        "{text}"
    );
    assert!(env.exists("sites/a.conf"));
}

/// `!CleanFiles` with `{{ role }}` in the pattern, keeping `keep`: a role's files are in
/// `clean/<role>/`, another's in `clean/victim/`.
async fn clean_role_dir(env: &mut Env, role: &str) -> Result<(), CommandError> {
    env.role = role.into();
    env.render("keep", "keep\n");
    env.write("clean/victim/important.conf", "precious");
    env.write(&format!("clean/{role}/keep.conf"), "x");
    env.write(&format!("clean/{role}/old.conf"), "x");
    let (result, _) = env
        .run(
            r#"- !CleanFiles {pattern: "$T/clean/{{ role }}/(*).conf", keep-list: "{{ files.keep }}"}"#,
        )
        .await;
    result
}

#[tokio::test]
async fn clean_files_takes_a_role_named_star_literally() {
    let mut env = Env::new();
    clean_role_dir(&mut env, "*").await.unwrap();
    assert_eq!(env.read("clean/victim/important.conf"), "precious");
    assert_eq!(env.names_in("clean/*"), names(&["keep.conf"]));
}

#[tokio::test]
async fn clean_files_takes_role_names_with_parentheses_and_brackets_literally() {
    for role in ["a(b)", "x)y(z", "[ab]?", "]", "(*)"] {
        let mut env = Env::new();
        clean_role_dir(&mut env, role)
            .await
            .unwrap_or_else(|e| panic!("{role}: {e}"));
        assert_eq!(
            env.read("clean/victim/important.conf"),
            "precious",
            "{role}"
        );
        assert_eq!(
            env.names_in(&format!("clean/{role}")),
            names(&["keep.conf"]),
            "{role}"
        );
    }
}

#[tokio::test]
async fn split_text_takes_a_role_named_star_literally() {
    let mut env = Env::new();
    env.role = "*".into();
    env.render("sites", "## a\nA\n");
    env.write("out/victim/stale.conf", "precious");
    env.write("out/*/stale.conf", "x");
    let split = SPLIT.replace("$T/out/(*).conf", "$T/out/{{ role }}/(*).conf");
    let (result, _) = env.run(&split).await;
    result.unwrap();
    assert_eq!(env.read("out/victim/stale.conf"), "precious");
    assert_eq!(env.names_in("out/*"), names(&["a.conf"]));
    assert_eq!(env.read("out/*/a.conf"), "A\n");
}

// ---- !Condition ----------------------------------------------------------------------------

const RELOAD_ON_ETC: &str = r#"
- !Condition
    dirs-changed: ["$T/etc"]
    commands:
    - !Cmd [touch, "$T/reloaded"]
"#;

#[tokio::test]
async fn condition_runs_only_after_a_change() {
    let mut env = Env::new();
    env.render("a", "v1\n");
    env.write("etc/a.conf", "v0\n");
    let copy = r#"- !Copy {src: "{{ files.a }}", dest: "$T/etc/a.conf"}"#;

    let (result, log) = env.run(&format!("{copy}{RELOAD_ON_ETC}")).await;
    result.unwrap();
    assert!(env.exists("reloaded"));
    assert!(
        log.text().contains("etc changed, running 1 command(s)"),
        "{:?}",
        log.lines
    );
    fs::remove_file(env.p("reloaded")).unwrap();

    // Same content written again: no reload.
    let (result, log) = env.run(&format!("{copy}{RELOAD_ON_ETC}")).await;
    result.unwrap();
    assert!(!env.exists("reloaded"));
    assert!(log.text().contains("no change in"), "{:?}", log.lines);

    // A mode change is a change.
    let copy_600 = r#"- !Copy {src: "{{ files.a }}", dest: "$T/etc/a.conf", mode: 0o600}"#;
    let (result, _) = env.run(&format!("{copy_600}{RELOAD_ON_ETC}")).await;
    result.unwrap();
    assert!(env.exists("reloaded"));
}

#[tokio::test]
async fn condition_sees_directories_appear_and_disappear() {
    let env = Env::new();
    let (result, _) = env
        .run(&format!("- !Cmd [mkdir, \"$T/etc\"]{RELOAD_ON_ETC}"))
        .await;
    result.unwrap();
    assert!(env.exists("reloaded"), "appeared");
    fs::remove_file(env.p("reloaded")).unwrap();

    let (result, _) = env
        .run(&format!("- !Cmd [rmdir, \"$T/etc\"]{RELOAD_ON_ETC}"))
        .await;
    result.unwrap();
    assert!(env.exists("reloaded"), "disappeared");
    fs::remove_file(env.p("reloaded")).unwrap();

    let (result, _) = env.run(RELOAD_ON_ETC).await;
    result.unwrap();
    assert!(!env.exists("reloaded"), "absent both times");
}

#[tokio::test]
async fn a_failing_nested_command_is_named_and_stops_the_rest() {
    let env = Env::new();
    let (result, _) = env
        .run(
            r#"
- !Cmd [mkdir, "$T/etc"]
- !Condition
    dirs-changed: ["$T/etc"]
    commands:
    - !Cmd ["true"]
    - !Cmd ["false"]
    - !Cmd [touch, "$T/after"]
- !Cmd [touch, "$T/after"]
"#,
        )
        .await;
    let err = result.unwrap_err();
    assert_eq!(
        err.to_string(),
        "command 2.2 (!Cmd): false exited with status 1"
    );
    assert_eq!(
        err.at(),
        At {
            index: 2,
            nested: Some(2),
            tag: "!Cmd"
        }
    );
    assert!(!env.exists("after"));
}

// ---- !PeekLog ------------------------------------------------------------------------------

#[tokio::test]
async fn peek_log_records_sizes_and_never_fails() {
    let mut env = Env::new();
    env.write("logs/app/current.log", "12345");
    env.log_dirs.insert("app".into(), env.p("logs/app"));
    let (result, log) = env
        .run(
            r#"
- !PeekLog "app/current.log"
- !PeekLog "app/not-yet.log"
- !PeekLog "other/current.log"
"#,
        )
        .await;
    result.unwrap();
    assert_eq!(
        log.external,
        [
            ("app/current.log".to_string(), 5),
            ("app/not-yet.log".to_string(), 0)
        ]
    );
    assert!(
        log.text().contains("no log dir \"other\""),
        "{:?}",
        log.lines
    );
}

// ---- Dry run -------------------------------------------------------------------------------

#[tokio::test]
async fn dry_run_changes_nothing_and_says_what_it_would_do() {
    let mut env = Env::new();
    env.dry_run = true;
    env.render("a", "v1\n");
    env.render("sites", "## alpha\nx\n");
    env.render("keep", "");
    env.write("out/old.conf", "stale");
    env.write("sites/a.conf", "x");
    env.write("logs/app/current.log", "123");
    env.log_dirs.insert("app".into(), env.p("logs/app"));
    let (result, log) = env
        .run(&format!(
            r#"
- !Cmd [touch, "$T/m1"]
- !Sh "touch $T/m2"
- !RootCommand [touch, "$T/m3"]
- !Copy {{src: "{{{{ files.a }}}}", dest: "$T/copied"}}
- !CleanFiles {{pattern: "$T/sites/(*).conf", keep-list: "{{{{ files.keep }}}}"}}
- !PeekLog app/current.log
{}{RELOAD_ON_ETC}"#,
            SPLIT.trim_start()
        ))
        .await;
    result.unwrap();
    for marker in ["m1", "m2", "m3", "copied", "reloaded", "out/alpha.conf"] {
        assert!(!env.exists(marker), "{marker} exists after a dry run");
    }
    assert!(env.exists("out/old.conf") && env.exists("sites/a.conf"));
    assert!(log.output.is_empty() && log.external.is_empty());
    let text = log.text();
    for expected in [
        "would run: touch ",
        "would copy ",
        "would write ",
        &format!("would remove {}", env.p("out/old.conf").display()),
        &format!("would remove {}", env.p("sites/a.conf").display()),
        "would note log app/current.log at 3 bytes",
        "would run the next 1 command(s) if one of",
    ] {
        assert!(text.contains(expected), "{expected:?} not in\n{text}");
    }
}

// ---- validate ------------------------------------------------------------------------------

#[test]
fn validate_accepts_a_good_list() {
    let commands = parse(
        r#"
- !PeekLog "vw/.global/latest"
- !RootCommand [lithos_switch, "{{ role }}", "{{ files.processes }}"]
- !SplitText {section: "^## (.*)$", validate: "[a-z]+", src: "{{ files.processes }}", dest: "/etc/s/{{ role }}-(*).conf"}
- !CleanFiles {pattern: "/etc/app/(**/*.conf)", keep-list: "{{ files.processes }}"}
- !Condition {dirs-changed: [/etc/s], commands: [!Sh "kill -HUP $(cat /run/x.pid)"]}
"#,
    )
    .unwrap();
    validate(&commands, &names(&["processes"])).unwrap();
}

#[test]
fn validate_rejects_each_mistake() {
    let cases = [
        ("!Cmd []", "command 1 (!Cmd): needs a program to run"),
        ("!RootCommand []", "needs a program to run"),
        ("!Cmd [\"\"]", "the program name is empty"),
        (
            "!Sh \"cat {{ files.b }}\"",
            "unknown variable {{ files.b }}",
        ),
        ("!Cmd [cat, \"{{ node }}\"]", "unknown variable {{ node }}"),
        (
            "!Copy {src: \"{{ tmp_file }}\", dest: /x}",
            "unknown variable {{ tmp_file }}",
        ),
        (
            "!Copy {src: /a, dest: \"/{{ files.z }}\"}",
            "unknown variable",
        ),
        ("!Copy {src: /a, dest: /etc/}", "must name a file"),
        ("!Copy {src: /a, dest: etc/x}", "must be an absolute path"),
        (
            "!SplitText {section: \"^## (.*\", validate: x, src: /a, dest: \"/s/(*)\"}",
            "bad regex \"^## (.*\"",
        ),
        (
            "!SplitText {section: \"^## .*\", validate: x, src: /a, dest: \"/s/(*)\"}",
            "needs a capture group",
        ),
        (
            "!SplitText {section: \"(.*)\", validate: \"[\", src: /a, dest: \"/s/(*)\"}",
            "bad regex \"[\"",
        ),
        (
            "!SplitText {section: \"(.*)\", validate: x, src: /a, dest: /s/x.conf}",
            "exactly one `(*)`",
        ),
        (
            "!SplitText {section: \"(.*)\", validate: x, src: /a, dest: \"/s/(*)/*.conf\"}",
            "exactly one `(*)`",
        ),
        (
            "!SplitText {section: \"(.*)\", validate: x, src: \"{{ files.q }}\", dest: \"/s/(*)\"}",
            "unknown variable",
        ),
        (
            "!CleanFiles {pattern: /s/*.conf, keep-list: /k}",
            "one capture group",
        ),
        (
            "!CleanFiles {pattern: \"/s/(*)/(*)\", keep-list: /k}",
            "one capture group",
        ),
        (
            "!CleanFiles {pattern: \"s/(*)\", keep-list: /k}",
            "absolute",
        ),
        (
            "!CleanFiles {pattern: \"/s/../(*)\", keep-list: /k}",
            "`..`",
        ),
        (
            "!CleanFiles {pattern: \"/s/a**/(*)\", keep-list: /k}",
            "whole path component",
        ),
        (
            "!CleanFiles {pattern: \"/s/(*)\", keep-list: \"{{ x }}\"}",
            "unknown variable",
        ),
        ("!PeekLog /var/log/x", "must be relative"),
        ("!PeekLog \"app/../../etc/shadow\"", "`..`"),
        ("!PeekLog app", "needs a log dir name and a path"),
        (
            "!Condition {dirs-changed: [/a], commands: [!Cmd [\"true\"], !Condition {dirs-changed: [/b], commands: []}]}",
            "command 1.2 (!Condition): a !Condition cannot contain another !Condition",
        ),
        (
            "!Condition {dirs-changed: [/a], commands: [!Cmd [x, \"{{ nope }}\"]]}",
            "command 1.1 (!Cmd): unknown variable {{ nope }}",
        ),
    ];
    for (yaml, expected) in cases {
        let commands = parse(&format!("- {yaml}")).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        let err = validate(&commands, &names(&["a"])).unwrap_err().to_string();
        assert!(err.contains(expected), "{yaml}: {err:?} lacks {expected:?}");
    }
}

#[tokio::test]
async fn run_commands_validates_the_whole_list_first() {
    let env = Env::new();
    let (result, _) = env
        .run(
            r#"
- !Cmd [touch, "$T/marker"]
- !Condition {dirs-changed: [/a], commands: [!Condition {dirs-changed: [/b], commands: []}]}
"#,
        )
        .await;
    let err = result.unwrap_err();
    assert_eq!(err.label(), "invalid");
    assert!(!env.exists("marker"));
}

#[test]
fn the_run_can_be_spawned() {
    fn assert_send<T: Send>(_: &T) {}
    let files = BTreeMap::new();
    let ctx = Context {
        role: "web",
        files: &files,
        log_dirs: &files,
        timeout: Duration::from_secs(1),
        dry_run: true,
    };
    let mut log = Collect::default();
    let run = run_commands(&[], &ctx, &mut log);
    assert_send(&run);
}
