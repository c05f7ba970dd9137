use std::fs;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::*;

fn vars(v: Value) -> Vars {
    Vars::new(v.as_object().cloned().unwrap_or_else(Map::new))
}

/// A config dir with `templates/<name>/` holding `files`.
fn template_dir(name: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = tmp.path().join("templates").join(name).join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    tmp
}

fn load(tmp: &tempfile::TempDir, name: &str) -> Result<TemplateSet, String> {
    TemplateSet::load(&tmp.path().join("templates"), name)
}

const RENDER: &str = "templates:\n  conf: app.conf.hbs\ncommands:\n- !Cmd [true]\n";

#[test]
fn handlebars_is_non_strict_and_does_not_escape() {
    let tmp = template_dir(
        "app/v1",
        &[
            ("app.render.yaml", RENDER),
            (
                "app.conf.hbs",
                "name={{name}} missing=[{{nope.deeper}}] html={{html}}\n",
            ),
        ],
    );
    let set = load(&tmp, "app/v1").unwrap();
    let out = set
        .render(
            "app.conf.hbs",
            &vars(json!({"name": "web", "html": "<a&b>"})),
        )
        .unwrap();
    assert_eq!(out, "name=web missing=[] html=<a&b>\n");
    assert_eq!(set.renderers.len(), 1);
    assert_eq!(set.renderers[0].name, "app.render.yaml");
    assert_eq!(set.renderers[0].templates["conf"], "app.conf.hbs");
}

/// A block tag alone on its line takes the line with it (Handlebars' "standalone" rule), for
/// the opening, `else` and closing tags; verwalter 0.13's Handlebars 0.26 left a blank line for
/// each (issue 28: the one difference found between the files 0.13 and this version wrote from
/// the same template; rendering.md's table of differences).
#[test]
fn a_handlebars_block_tag_alone_on_its_line_leaves_no_blank_line() {
    let template = "upstream {\n{{#each servers}}\n  server {{this}};\n{{/each}}\n}\n\
                    {{#if tls}}\nssl on;\n{{else}}\nssl off;\n{{/if}}\nend\n";
    let tmp = template_dir(
        "app/v1",
        &[("app.render.yaml", RENDER), ("app.conf.hbs", template)],
    );
    let set = load(&tmp, "app/v1").unwrap();
    let out = set
        .render(
            "app.conf.hbs",
            &vars(json!({"servers": ["a:80", "b:80"], "tls": false})),
        )
        .unwrap();
    assert_eq!(
        out,
        "upstream {\n  server a:80;\n  server b:80;\n}\nssl off;\nend\n"
    );
}

#[test]
fn tera_renders_without_autoescape() {
    let tmp = template_dir(
        "app/v1",
        &[
            (
                "app.render.yaml",
                "templates:\n  conf: sub/app.yaml.tera\ncommands: []\n",
            ),
            (
                "sub/app.yaml.tera",
                "{% for d in daemons %}{{ d.name }}: {{ d.n * 2 }} {{ html }}\n{% endfor %}",
            ),
        ],
    );
    let set = load(&tmp, "app/v1").unwrap();
    let out = set
        .render(
            "sub/app.yaml.tera",
            &vars(
                json!({"daemons": [{"name": "a", "n": 1}, {"name": "b", "n": 2}], "html": "<x>"}),
            ),
        )
        .unwrap();
    assert_eq!(out, "a: 2 <x>\nb: 4 <x>\n");
}

#[test]
fn template_errors_name_the_file_and_line() {
    let tmp = template_dir(
        "app/v1",
        &[
            ("app.render.yaml", RENDER),
            ("app.conf.hbs", "line one\nline two {{#if}}\n"),
        ],
    );
    let err = load(&tmp, "app/v1").unwrap_err();
    assert!(
        err.starts_with("templates/app/v1/app.conf.hbs: line "),
        "{err}"
    );
    assert!(err.contains(", column "), "{err}");

    let tmp = template_dir(
        "app/v1",
        &[
            ("app.render.yaml", "templates:\n  conf: a.tera\n"),
            ("a.tera", "ok\n{% if %}\n"),
        ],
    );
    let err = load(&tmp, "app/v1").unwrap_err();
    assert!(err.starts_with("templates/app/v1/a.tera"), "{err}");
    assert!(err.contains("2:"), "the line is named: {err}");

    // A render-time error (tera: unknown variable) names the template too.
    let tmp = template_dir(
        "app/v1",
        &[
            ("app.render.yaml", "templates:\n  conf: a.tera\n"),
            ("a.tera", "{{ missing_var }}"),
        ],
    );
    let set = load(&tmp, "app/v1").unwrap();
    let err = set.render("a.tera", &vars(json!({}))).unwrap_err();
    assert!(err.starts_with("templates/app/v1/a.tera"), "{err}");
    assert!(err.contains("missing_var"), "{err}");
}

#[test]
fn render_yaml_accepts_dashes_or_underscores_and_names_unknown_keys() {
    let parts = template_set::parse_render_file(
        "_anchors: &x [a]\ntemplates: {a: a.hbs}\ncommands:\n\
         - !CleanFiles {pattern: '/tmp/(*).conf', keep_list: '{{ files.a }}'}\n\
         - !CleanFiles {pattern: '/tmp/(*).conf', keep-list: '{{ files.a }}'}\n",
    )
    .unwrap();
    assert_eq!(parts.commands.len(), 2);
    assert_eq!(parts.commands[0], parts.commands[1]);

    let err = template_set::parse_render_file("templates: {}\ncommand: []\n").unwrap_err();
    assert!(err.contains("command"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    let err = template_set::parse_render_file("commands:\n- !Bogus [x]\n").unwrap_err();
    assert!(err.contains("Bogus"), "{err}");
}

#[test]
fn a_render_yaml_must_point_at_real_templates_inside_the_dir() {
    for (render, expect) in [
        ("templates: {a: nope.hbs}\n", "is not a template"),
        (
            "templates: {a: ../other/x.hbs}\n",
            "leaves the template dir",
        ),
        ("templates: {a: sub/../nope.hbs}\n", "is not a template"),
        (
            "templates: {a: ../../../etc/passwd}\n",
            "leaves the template dir",
        ),
        (
            "templates: {a: x.hbs}\ncommands:\n- !Cmd [echo, '{{ files.b }}']\n",
            "files.b",
        ),
    ] {
        let tmp = template_dir("app/v1", &[("app.render.yaml", render), ("x.hbs", "x")]);
        let err = load(&tmp, "app/v1").unwrap_err();
        assert!(err.starts_with("templates/app/v1/app.render.yaml"), "{err}");
        assert!(err.contains(expect), "{render}: {err}");
    }
    let tmp = template_dir("app/v1", &[("x.hbs", "x")]);
    assert!(
        load(&tmp, "app/v1")
            .unwrap_err()
            .contains("no *.render.yaml")
    );
    let tmp = template_dir("app/v1", &[("app.render.yaml", RENDER), ("x.trm", "x")]);
    assert!(load(&tmp, "app/v1").unwrap_err().contains("trimmer"));
}

#[test]
fn a_symlink_cannot_lead_a_template_dir_outside_templates() {
    let tmp = template_dir(
        "app/v1",
        &[("app.render.yaml", RENDER), ("app.conf.hbs", "x")],
    );
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("app.render.yaml"), RENDER).unwrap();
    std::os::unix::fs::symlink(outside.path(), tmp.path().join("templates/evil")).unwrap();
    assert!(
        load(&tmp, "evil")
            .unwrap_err()
            .contains("outside templates/")
    );
}

#[test]
fn read_templates_hashes_every_file_and_spots_full_schedule() {
    let tmp = template_dir(
        "app/v1",
        &[
            ("a.hbs", "{{ full_schedule.roles }}"),
            ("b.tera", "plain"),
            (".hidden", "skipped"),
        ],
    );
    let mut errors = Vec::new();
    let t = read_templates(tmp.path(), &mut errors);
    assert!(errors.is_empty());
    let files: Vec<_> = t
        .dir("app/v1")
        .map(|(p, f)| (p.clone(), f.clone()))
        .collect();
    assert_eq!(files.len(), 2);
    assert_eq!(files[0].0, "app/v1/a.hbs");
    assert!(files[0].1.mentions_full_schedule);
    assert!(!files[1].1.mentions_full_schedule);
    let before = files[1].1.hash.clone();
    fs::write(tmp.path().join("templates/app/v1/b.tera"), "changed").unwrap();
    let t = read_templates(tmp.path(), &mut errors);
    assert_ne!(t.files["app/v1/b.tera"].hash, before);
    assert_eq!(t.dir("app").count(), 2, "a dir holds its subdirs' files");
    assert_eq!(t.dir("ap").count(), 0, "a dir prefix is a whole component");
}

#[test]
fn log_dirs_come_from_sandbox_yaml() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("sandbox")).unwrap();
    fs::write(
        tmp.path().join("sandbox/global.yaml"),
        "log-dirs:\n  vw: /tmp/logs\n",
    )
    .unwrap();
    let dirs = read_log_dirs(tmp.path()).unwrap();
    assert_eq!(dirs["vw"], PathBuf::from("/tmp/logs"));
    fs::write(tmp.path().join("sandbox/bad.yaml"), "log-dirs: [1, 2]\n").unwrap();
    assert!(read_log_dirs(tmp.path()).unwrap_err().contains("bad.yaml"));
}

/// YAML nesting `levels` deep, one block level a line.
fn nested_yaml(levels: usize) -> String {
    (0..levels)
        .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
        .collect()
}

#[test]
fn sandbox_yaml_has_the_runtime_size_and_nesting_limits() {
    // Issue 10: sandbox/*.yaml had no limits: a huge or deeply nested file cost the daemon's
    // start as much memory or time as it liked (the YAML loader is quadratic in the depth).
    let tmp = tempfile::tempdir().unwrap();
    let sandbox = tmp.path().join("sandbox");
    fs::create_dir_all(&sandbox).unwrap();
    fs::write(sandbox.join("big.yaml"), "#".repeat(1_100_000)).unwrap();
    let big = sandbox.join("big.yaml").display().to_string();
    assert_eq!(
        read_log_dirs(tmp.path()).unwrap_err(),
        format!("{big}: 1100000 bytes; config files are limited to 1048576 bytes (1 MiB)")
    );
    fs::remove_file(sandbox.join("big.yaml")).unwrap();
    fs::write(
        sandbox.join("deep.yaml"),
        format!("log-dirs: {{}}\n{}", nested_yaml(500)),
    )
    .unwrap();
    let deep = sandbox.join("deep.yaml").display().to_string();
    assert_eq!(
        read_log_dirs(tmp.path()).unwrap_err(),
        format!("{deep}:130: nested deeper than 128 levels; refused unparsed")
    );
    // Just under both limits is read as before.
    let padded = format!("log-dirs:\n  vw: /tmp/logs\n{}\n", "#".repeat(1_000_000));
    fs::write(sandbox.join("deep.yaml"), padded).unwrap();
    assert_eq!(
        read_log_dirs(tmp.path()).unwrap()["vw"],
        PathBuf::from("/tmp/logs")
    );
}

#[test]
fn render_yaml_has_the_runtime_size_and_nesting_limits() {
    let big = format!("{RENDER}{}\n", "#".repeat(1_100_000));
    let tmp = template_dir(
        "app/v1",
        &[("app.render.yaml", &big), ("app.conf.hbs", "x")],
    );
    assert_eq!(
        load(&tmp, "app/v1").unwrap_err(),
        format!(
            "templates/app/v1/app.render.yaml: {} bytes; config files are limited to 1048576 bytes (1 MiB)",
            big.len()
        )
    );
    let deep = format!("{RENDER}{}", nested_yaml(500));
    let tmp = template_dir(
        "app/v1",
        &[("app.render.yaml", &deep), ("app.conf.hbs", "x")],
    );
    assert_eq!(
        load(&tmp, "app/v1").unwrap_err(),
        "templates/app/v1/app.render.yaml:133: nested deeper than 128 levels; refused unparsed"
    );
}

#[test]
fn a_symlink_loop_ends_the_walk_and_a_linked_template_dir_counts() {
    let tmp = template_dir(
        "app/v1",
        &[("app.render.yaml", RENDER), ("app.conf.hbs", "x")],
    );
    let templates = tmp.path().join("templates");
    // A loop back to templates/, and a second name for app/.
    std::os::unix::fs::symlink(&templates, templates.join("app/v1/loop")).unwrap();
    std::os::unix::fs::symlink(templates.join("app"), templates.join("alias")).unwrap();
    let mut errors = Vec::new();
    let t = read_templates(tmp.path(), &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    let paths: Vec<&String> = t.files.keys().collect();
    assert!(
        paths.contains(&&"app/v1/app.conf.hbs".to_string()),
        "{paths:?}"
    );
    assert!(
        paths.contains(&&"alias/v1/app.conf.hbs".to_string()),
        "{paths:?}"
    );
    assert!(paths.len() < 20, "no endless walk: {paths:?}");
    // A template dir loads through the loop too.
    assert!(load(&tmp, "app/v1").is_ok());
    assert!(check_template_dirs(tmp.path()).is_empty());
}

#[test]
fn a_template_linked_out_of_templates_is_refused_by_name() {
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("shadow"), "root:secret").unwrap();
    let tmp = template_dir(
        "app/v1",
        &[("app.render.yaml", RENDER), ("common.hbs", "shared")],
    );
    let templates = tmp.path().join("templates");
    let linked = templates.join("app/v1/app.conf.hbs");
    std::os::unix::fs::symlink(outside.path().join("shadow"), &linked).unwrap();
    // A link to a file elsewhere on the machine would render it into the role's files.
    let err = load(&tmp, "app/v1").unwrap_err();
    assert!(
        err.starts_with("templates/app/v1/app.conf.hbs: symlink to ") && err.contains("outside"),
        "{err}"
    );
    let mut errors = Vec::new();
    let t = read_templates(tmp.path(), &mut errors);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "templates/app/v1/app.conf.hbs");
    assert!(!t.files.contains_key("app/v1/app.conf.hbs"));
    assert_eq!(check_template_dirs(tmp.path()).len(), 1);
    // A link inside templates/ is fine.
    fs::remove_file(&linked).unwrap();
    std::os::unix::fs::symlink("common.hbs", &linked).unwrap();
    assert!(load(&tmp, "app/v1").is_ok());
}

#[tokio::test]
async fn a_role_applies_when_its_log_cannot_be_written() {
    use verwalter_controllers::machinery::ports::{RoleApplier, RoleJob};
    use verwalter_controllers::node::StoreWriter;

    let out = tempfile::tempdir().unwrap();
    let marker = out.path().join("applied");
    let render = format!(
        "templates:\n  conf: app.conf.hbs\ncommands:\n- !Cmd [touch, {}]\n",
        marker.display()
    );
    let config = template_dir(
        "app/v1",
        &[("app.render.yaml", &render), ("app.conf.hbs", "x\n")],
    );
    let writer = StoreWriter::new(None);
    writer
        .templates
        .set(read_templates(config.path(), &mut Vec::new()));
    let log_dir = out.path().join("log");
    fs::create_dir(&log_dir).unwrap();
    fs::write(
        log_dir.join("web"),
        "a file where the role's log dir should be",
    )
    .unwrap();
    let logs = LogDir::open(&log_dir, crate::storage::logs::LogLimits::default());
    let applier = Applier::new(
        ApplierConfig {
            config_dir: config.path().to_path_buf(),
            staging_dir: out.path().join("staging"),
            command_timeout: std::time::Duration::from_secs(30),
            dry_run: false,
            log_dirs: Default::default(),
        },
        logs.clone(),
        writer.store().templates.clone(),
    );
    let job = RoleJob {
        role: "web".into(),
        template: "app/v1".into(),
        deployment_id: "dep".into(),
        vars: Arc::new(Map::new()),
        unparsed: Vec::new(),
    };
    applier.apply(job).await.expect("the role applies");
    assert!(marker.exists(), "its command ran");
    let problem = logs.problem().expect("the log failure is reported");
    assert!(problem.contains("web"), "{problem}");
}

/// Every file under `dir`, read and joined (a role's log, whatever its segments).
fn read_all(dir: &std::path::Path) -> String {
    let mut text = String::new();
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            text.push_str(&read_all(&path));
        } else if let Ok(part) = fs::read_to_string(&path) {
            text.push_str(&part);
        }
    }
    text
}

#[tokio::test]
async fn values_kept_as_text_are_parsed_for_templates_that_name_them_and_logged_as_text() {
    use verwalter_controllers::machinery::ports::{RoleApplier, RoleJob};
    use verwalter_controllers::node::StoreWriter;
    use verwalter_controllers::schedule::data::TextPart;

    let config = tempfile::tempdir().unwrap();
    for (dir, template) in [
        (
            "named/v1",
            "{{#each services}}{{@key}}={{image}};{{/each}} v={{v}}\n",
        ),
        ("unnamed/v1", "v={{v}}\n"),
    ] {
        let at = config.path().join("templates").join(dir);
        fs::create_dir_all(&at).unwrap();
        fs::write(at.join("app.render.yaml"), RENDER).unwrap();
        fs::write(at.join("app.conf.hbs"), template).unwrap();
    }
    let writer = StoreWriter::new(None);
    writer
        .templates
        .set(read_templates(config.path(), &mut Vec::new()));
    let out = tempfile::tempdir().unwrap();
    fs::create_dir(out.path().join("log")).unwrap();
    let logs = LogDir::open(
        &out.path().join("log"),
        crate::storage::logs::LogLimits::default(),
    );
    let applier = Applier::new(
        ApplierConfig {
            config_dir: config.path().to_path_buf(),
            staging_dir: out.path().join("staging"),
            command_timeout: std::time::Duration::from_secs(30),
            dry_run: false,
            log_dirs: Default::default(),
        },
        logs.clone(),
        writer.store().templates.clone(),
    );
    let job = |role: &str, template: &str, id: &str, image: &str| RoleJob {
        role: role.into(),
        template: template.into(),
        deployment_id: id.into(),
        vars: Arc::new(json!({"v": 1}).as_object().unwrap().clone()),
        unparsed: vec![(
            "services".into(),
            TextPart::of(&json!({"s1": {"image": image}, "s2": {"image": "j"}})),
        )],
    };
    for (id, image) in [("dep1", "i1"), ("dep2", "i2")] {
        for (role, template) in [("a", "named/v1"), ("b", "unnamed/v1")] {
            applier
                .apply(job(role, template, id, image))
                .await
                .expect("the role applies");
        }
        let rendered = |role: &str| {
            fs::read_to_string(out.path().join("staging").join(role).join("0.conf")).unwrap()
        };
        assert_eq!(rendered("a"), format!("s1={image};s2=j; v=1\n"));
        assert_eq!(rendered("b"), "v=1\n");
    }
    for role in ["a", "b"] {
        let log = read_all(&out.path().join("log").join(role));
        assert!(
            log.contains(r#""services": {"#) && log.contains(r#""image": "i1""#),
            "the first entry shows the value whole: {log}"
        );
        assert!(
            log.contains(
                "Template variables: 1 change since deployment dep1 (the whole: GET \
                 /v1/roles_data, to_render."
            ) && log.contains("  changed services.s1.image: \"i1\" -> \"i2\"\n"),
            "{log}"
        );
    }
}
