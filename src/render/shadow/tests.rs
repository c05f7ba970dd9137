use std::fs;

use serde_json::json;

use super::*;

/// A config dir with `templates/web/v1` (two files) and `web/v2` (one changed, one gone, one
/// new), whose render files' commands would create `marker` in the config dir.
fn config() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("marker");
    let m = marker.display();
    let files = [
        (
            "web/v1/web.render.yaml",
            format!(
                "templates:\n  conf: web.conf.hbs\n  env: web.env.hbs\ncommands:\n\
                 - !Cmd [touch, \"{m}\"]\n- !Sh \"touch {m}.sh\"\n"
            ),
        ),
        (
            "web/v1/web.conf.hbs",
            "# deployment {{deployment_id}}\nport: {{port}}\nworkers: 2\nlog: info\n".into(),
        ),
        ("web/v1/web.env.hbs", "ROLE={{role}}\n".into()),
        (
            "web/v2/web.render.yaml",
            format!(
                "templates:\n  conf: web.conf.hbs\n  limits: limits.hbs\ncommands:\n\
                 - !Cmd [touch, \"{m}\"]\n"
            ),
        ),
        (
            "web/v2/web.conf.hbs",
            "# deployment {{deployment_id}}\nport: {{port}}\nworkers: 4\nlog: info\n".into(),
        ),
        ("web/v2/limits.hbs", "nofile={{nofile}}\n".into()),
    ];
    for (path, text) in files {
        let p = tmp.path().join("templates").join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    tmp
}

fn vars(template: &str) -> Map<String, Value> {
    json!({"template": template, "role": "web", "port": 8080, "nofile": 1024,
           "deployment_id": "D1"})
    .as_object()
    .cloned()
    .unwrap()
}

#[test]
fn a_changed_template_gives_the_file_diff_and_runs_no_command() {
    let config = config();
    let scratch = tempfile::tempdir().unwrap();
    let got = shadow_render(
        config.path(),
        "web",
        vars("web/v1"),
        vars("web/v2"),
        Some(scratch.path()),
    )
    .unwrap();
    assert_eq!(
        got,
        ShadowRender {
            role: "web".into(),
            real_template: "web/v1".into(),
            shadow_template: "web/v2".into(),
            identical: false,
            files: vec![
                FileDiff {
                    file: "web.render.yaml:conf".into(),
                    kind: FileChange::Changed,
                    diff: "--- real/templates/web/v1/web.conf.hbs\n\
                           +++ shadow/templates/web/v2/web.conf.hbs\n\
                           @@ -1,4 +1,4 @@\n # deployment D1\n port: 8080\n-workers: 2\n\
                           +workers: 4\n log: info\n"
                        .into(),
                },
                FileDiff {
                    file: "web.render.yaml:env".into(),
                    kind: FileChange::Removed,
                    diff: "--- real/templates/web/v1/web.env.hbs\n+++ /dev/null\n\
                           @@ -1 +0,0 @@\n-ROLE=web\n"
                        .into(),
                },
                FileDiff {
                    file: "web.render.yaml:limits".into(),
                    kind: FileChange::Added,
                    diff: "--- /dev/null\n+++ shadow/templates/web/v2/limits.hbs\n\
                           @@ -0,0 +1 @@\n+nofile=1024\n"
                        .into(),
                },
            ],
            unchanged: vec![],
        }
    );
    // Neither side's commands ran, and the scratch dir is gone.
    assert!(!config.path().join("marker").exists());
    assert!(!config.path().join("marker.sh").exists());
    assert_eq!(fs::read_dir(scratch.path()).unwrap().count(), 0);
}

#[test]
fn the_same_template_is_identical_and_lists_its_files_unchanged() {
    let config = config();
    let got = shadow_render(config.path(), "web", vars("web/v1"), vars("web/v1"), None).unwrap();
    assert!(got.identical);
    assert!(got.files.is_empty());
    assert_eq!(
        got.unchanged,
        ["web.render.yaml:conf", "web.render.yaml:env"]
    );
    // Other variables on the same template (another schedule's) show as a diff too.
    let mut other = vars("web/v1");
    other.insert("port".into(), json!(9090));
    let got = shadow_render(config.path(), "web", vars("web/v1"), other, None).unwrap();
    assert_eq!(got.files.len(), 1);
    assert!(got.files[0].diff.contains("-port: 8080\n+port: 9090\n"));
}

#[test]
fn errors_name_the_side_and_the_template_dir() {
    let config = config();
    let err =
        shadow_render(config.path(), "web", vars("web/v1"), vars("web/v9"), None).unwrap_err();
    assert!(err.starts_with("shadow: templates/web/v9"), "{err}");
    let err =
        shadow_render(config.path(), "web", vars("web/v0"), vars("web/v2"), None).unwrap_err();
    assert!(err.starts_with("real: templates/web/v0"), "{err}");
    let mut none = vars("web/v1");
    none.remove("template");
    let err = shadow_render(config.path(), "web", vars("web/v1"), none, None).unwrap_err();
    assert_eq!(
        err,
        "shadow: the variables have no `template` (a dir under templates/)"
    );
    assert!(!config.path().join("marker").exists());
}

#[test]
fn a_candidate_is_a_template_dir_or_a_version_of_the_roles_template() {
    assert_eq!(candidate_template("web/v1", "v2").unwrap(), "web/v2");
    assert_eq!(candidate_template("web/v1", "api/v3").unwrap(), "api/v3");
    assert_eq!(candidate_template("a/b/v1", "v2").unwrap(), "a/b/v2");
    assert_eq!(candidate_template("flat", "other").unwrap(), "other");
    for bad in ["", "..", "../etc", "web/../../x", "/etc/v1", "web//v2"] {
        let err = candidate_template("web/v1", bad);
        if bad == "web//v2" {
            // `Path` folds the double slash; the template loader sees `web//v2` = `web/v2`.
            assert!(err.is_ok());
            continue;
        }
        assert!(err.is_err(), "{bad:?}: {err:?}");
    }
}
