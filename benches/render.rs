//! Render benchmark (issue 3): one node, 500 roles, 2,000 template files (500 template dirs of
//! three Handlebars templates and a `*.render.yaml` each; every role copies its three rendered
//! files into its own output dir with `!Copy`; even-numbered roles then run `!Cmd [true]`).
//!
//! Prints, as medians with min and max over the rounds:
//! - a pass where nothing changed: every role's desired hash computed and compared;
//! - roles changed: from the new schedule in the store to the files of roles r0 and r1 in place
//!   and r0's command run (the whole pass over 500 roles, with the render controller, the real
//!   applier, deployment log and storage dir), and the spawn-and-wait time of `true` alone;
//! - the floor: the same three files written with temp file + fsync + rename in a plain loop, and
//!   the ratio to it of r1's render and apply (r1 has no command: only files).
//!
//! Run: `cargo bench --bench render`.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use std::time::{Duration, Instant};

use serde_json::{Map, json};
use verwalter::render::{Applier, ApplierConfig, read_templates};
use verwalter::storage::logs::{LogDir, LogLimits};
use verwalter::storage::state_dir::StateDir;
use verwalter_controllers::machinery::clock::SystemClock;
use verwalter_controllers::machinery::driver::Reconciler;
use verwalter_controllers::machinery::ports::{RoleApplier, RoleJob};
use verwalter_controllers::node::StoreWriter;
use verwalter_controllers::render::RenderController;
use verwalter_controllers::state::Schedule;

const ROLES: usize = 500;
const ROUNDS: usize = 31;
const HOST: &str = "alpha";

fn main() {
    let tmp = tempfile::Builder::new()
        .prefix("verwalter-bench-render.")
        .tempdir_in(std::env::var_os("BENCH_DIR").unwrap_or_else(|| "target".into()))
        .unwrap();
    let config = tmp.path().join("config");
    let out = tmp.path().join("out");
    make_templates(&config, &out);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(tmp.path(), &config, &out));
}

fn make_templates(config: &Path, out: &Path) {
    for i in 0..ROLES {
        let dir = config.join(format!("templates/r{i}/v1"));
        fs::create_dir_all(&dir).unwrap();
        let dest = out.join(format!("r{i}"));
        fs::create_dir_all(&dest).unwrap();
        let d = dest.display();
        let command = if i % 2 == 0 { "- !Cmd [true]\n" } else { "" };
        fs::write(
            dir.join("role.render.yaml"),
            format!(
                "templates:\n  a: a.conf.hbs\n  b: b.conf.hbs\n  c: c.yaml.hbs\ncommands:\n\
                 - !Copy {{src: '{{{{ files.a }}}}', dest: '{d}/a.conf'}}\n\
                 - !Copy {{src: '{{{{ files.b }}}}', dest: '{d}/b.conf'}}\n\
                 - !Copy {{src: '{{{{ files.c }}}}', dest: '{d}/c.yaml'}}\n{command}"
            ),
        )
        .unwrap();
        fs::write(
            dir.join("a.conf.hbs"),
            "# {{role}} on {{node}}\nversion = {{version}}\nport = {{port}}\n\
             {{#each backends}}backend {{this}}\n{{/each}}",
        )
        .unwrap();
        fs::write(
            dir.join("b.conf.hbs"),
            "[{{role}}]\nimage = {{image}}\ninstances = {{instances}}\nlimit = {{limits.memory}}\n",
        )
        .unwrap();
        fs::write(
            dir.join("c.yaml.hbs"),
            "{{role}}-daemon:\n  kind: Daemon\n  image: {{image}}\n  config: /config/{{role}}.yaml\n  instances: {{instances}}\n",
        )
        .unwrap();
    }
}

fn schedule(version: u64) -> Schedule {
    let mut roles = Map::new();
    for i in 0..ROLES {
        // Roles r0 and r1 change between rounds.
        let v = if i < 2 { version } else { 1 };
        roles.insert(
            format!("r{i}"),
            json!({
                "template": format!("r{i}/v1"), "version": format!("v{v}"),
                "image": format!("r{i}.v{v}"), "instances": 1 + i % 3, "port": 8000 + i,
                "backends": ["10.0.0.1:80", "10.0.0.2:80"], "limits": {"memory": "1G"},
            }),
        );
    }
    let data = json!({"vars": {"cluster": "bench"}, "nodes": {HOST: {"roles": roles}}});
    Schedule::new(data, 1_700_000_000_000 + version, "0".repeat(32))
}

async fn pass(controller: &Arc<RenderController>) {
    for role in controller.keys() {
        controller
            .clone()
            .reconcile(role)
            .await
            .expect("every role applies");
    }
}

async fn run(base: &Path, config: &Path, out: &Path) {
    let writer = StoreWriter::new(None);
    let store = writer.store();
    let StoreWriter {
        schedule: schedule_field,
        templates,
        roles,
        ..
    } = writer;
    templates.set(read_templates(config, &mut Vec::new()));
    let state_dir = StateDir::new(base.join("storage"));
    let logs = LogDir::open(&base.join("log"), LogLimits::default());
    let applier = Applier::new(
        ApplierConfig {
            config_dir: config.to_path_buf(),
            staging_dir: state_dir.staging_dir(),
            command_timeout: Duration::from_secs(30),
            dry_run: false,
            log_dirs: Default::default(),
        },
        logs.clone(),
        store.templates.clone(),
    );
    let timed = Arc::new(Timed {
        inner: applier,
        last: Arc::new(Mutex::new(Default::default())),
    });
    let controller = Arc::new(RenderController::new(
        store.clone(),
        HOST.into(),
        roles,
        timed.clone(),
        Arc::new(state_dir),
        logs,
        Arc::new(SystemClock),
    ));

    let started = Instant::now();
    schedule_field.set(Some(schedule(1)));
    pass(&controller).await;
    println!(
        "first pass, all {ROLES} roles rendered and applied: {:.0} ms",
        ms(started.elapsed())
    );
    assert!(out.join(format!("r{}/c.yaml", ROLES - 1)).exists());

    let mut unchanged = Vec::new();
    let mut restamped = Vec::new();
    let mut changed = Vec::new();
    let mut spawn = Vec::new();
    let mut role_apply = Vec::new();
    let mut floor = Vec::new();
    for round in 0..ROUNDS {
        let t = Instant::now();
        pass(&controller).await;
        unchanged.push(t.elapsed());

        // A new schedule (new timestamp) with the same data: every role's variables are
        // computed again, none differs.
        let mut same = schedule(1 + round as u64);
        same.timestamp += 1;
        let t = Instant::now();
        schedule_field.set(Some(same));
        pass(&controller).await;
        restamped.push(t.elapsed());

        let t = Instant::now();
        schedule_field.set(Some(schedule(2 + round as u64)));
        pass(&controller).await;
        changed.push(t.elapsed());
        role_apply.push(timed.last.lock().unwrap()["r1"]);
        let text = fs::read_to_string(out.join("r1/b.conf")).unwrap();
        assert!(text.contains(&format!("r1.v{}", 2 + round)), "{text}");

        let t = Instant::now();
        let status = tokio::process::Command::new("true").status().await.unwrap();
        assert!(status.success());
        spawn.push(t.elapsed());

        let t = Instant::now();
        for (name, text) in [("a.conf", &text), ("b.conf", &text), ("c.yaml", &text)] {
            write_fsync_rename(&out.join("floor").join(name), text.as_bytes());
        }
        floor.push(t.elapsed());
    }
    let (u, umin, umax) = stats(&mut unchanged);
    let (r, rmin, rmax) = stats(&mut restamped);
    let (c, cmin, cmax) = stats(&mut changed);
    let (s, smin, smax) = stats(&mut spawn);
    let mut pair_ratios: Vec<f64> = role_apply
        .iter()
        .zip(&floor)
        .map(|(a, f)| a.as_secs_f64() / f.as_secs_f64())
        .collect();
    pair_ratios.sort_by(f64::total_cmp);
    let (f, fmin, fmax) = stats(&mut floor);
    let (a, amin, amax) = stats(&mut role_apply);
    println!(
        "{ROUNDS} rounds, {ROLES} roles, {} template files:",
        ROLES * 4
    );
    println!(
        "  pass, nothing changed        median {:>7.3} ms  (min {:.3}, max {:.3})",
        ms(u),
        ms(umin),
        ms(umax)
    );
    println!(
        "  new schedule, nothing changed median {:>6.3} ms  (min {:.3}, max {:.3})",
        ms(r),
        ms(rmin),
        ms(rmax)
    );
    println!(
        "  pass, two roles changed      median {:>7.3} ms  (min {:.3}, max {:.3})",
        ms(c),
        ms(cmin),
        ms(cmax)
    );
    println!(
        "    of which `true` (spawn+wait) median {:>5.3} ms  (min {:.3}, max {:.3})",
        ms(s),
        ms(smin),
        ms(smax)
    );
    println!(
        "  floor: 3 files temp+fsync+rename median {:>5.3} ms  (min {:.3}, max {:.3})",
        ms(f),
        ms(fmin),
        ms(fmax)
    );
    println!(
        "  r1's render+apply (files only) median {:>5.3} ms  (min {:.3}, max {:.3}) = {:.2} x the floor",
        ms(a),
        ms(amin),
        ms(amax),
        a.as_secs_f64() / f.as_secs_f64()
    );
    println!(
        "  ratio per round (r1 and the floor back to back): median {:.2} (quartiles {:.2}, {:.2})",
        pair_ratios[pair_ratios.len() / 2],
        pair_ratios[pair_ratios.len() / 4],
        pair_ratios[pair_ratios.len() * 3 / 4]
    );
    println!(
        "  schedule accepted -> files in place, r0's command run and waited for: {:.3} ms",
        ms(c)
    );
}

/// The real applier, timing each call.
struct Timed {
    inner: Applier,
    last: Arc<Mutex<std::collections::HashMap<String, Duration>>>,
}

impl RoleApplier for Timed {
    fn apply(
        &self,
        job: RoleJob,
    ) -> BoxFuture<'static, Result<(), verwalter_controllers::machinery::ports::ApplyError>> {
        let role = job.role.clone();
        let inner = self.inner.apply(job);
        let last = self.last.clone();
        Box::pin(async move {
            let t = Instant::now();
            let result = inner.await;
            last.lock().unwrap().insert(role, t.elapsed());
            result
        })
    }
}

fn write_fsync_rename(path: &Path, bytes: &[u8]) {
    let dir = path.parent().unwrap();
    fs::create_dir_all(dir).unwrap();
    let tmp = dir.join(format!(
        ".tmp.{}",
        path.file_name().unwrap().to_string_lossy()
    ));
    let mut file = fs::File::create(&tmp).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
    fs::rename(&tmp, path).unwrap();
}

fn stats(v: &mut [Duration]) -> (Duration, Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
