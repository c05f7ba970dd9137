//! The `verwalter` command: the daemon (`run`) and the offline tools (`check`, `schedule`).
//! A hidden `generate` writes the man pages and shell completions `make package` ships.

// No production function over 120 lines (the threshold is the workspace's clippy.toml); tests
// may be longer.
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use verwalter::config::{Config, RunArgs};
use verwalter::inputs::{SCHEDULER_DIR, read_inputs, scheduler_dir};
use verwalter::machinery::identity;
use verwalter::schedule::lua::Limits;
use verwalter_controllers::defaults;
use verwalter_controllers::machinery::clock::{Clock, SystemClock};
use verwalter_controllers::render::vars;
use verwalter_controllers::state::{Inputs, Schedule, SchedulerInput};

#[derive(Debug, Parser)]
#[command(
    name = "verwalter",
    version,
    about = "Keeps a cluster's services configured.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Without a subcommand, the daemon runs with these flags (as verwalter 0.13 did).
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon.
    Run(RunArgs),
    /// Validate a config dir: runtime files and template dirs parse, the scheduler runs once and
    /// gives this node's roles usable variables. With --placement-config, validate that
    /// placement (wca-scheduler) config file instead.
    Check(CheckArgs),
    /// Run the scheduler once and print the schedule (stdout) and its log (stderr).
    Schedule(ScheduleArgs),
    /// Render one role as the daemon would: print its files and run (or show) its commands.
    Render(RenderCliArgs),
    /// Placement tools (wca-scheduler's algorithms).
    Placement(PlacementArgs),
    /// Serve the Kubernetes scheduler extender (a drop-in for wca-scheduler) on its own address.
    Extender(verwalter::placement::extender::ExtenderFlags),
    /// Run ernest-style dependency-graph builds received over NATS (build.create, ...).
    Graph(verwalter::ernest::GraphFlags),
    /// Shadow schedulers: the latest diff from a running leader, or promote one to v1.
    Shadow(verwalter::schedule::shadow::cli::ShadowArgs),
}

#[derive(Debug, clap::Args)]
struct PlacementArgs {
    #[command(subcommand)]
    command: PlacementCommand,
}

#[derive(Debug, Subcommand)]
enum PlacementCommand {
    /// Run a task set through each algorithm of a placement config on a node set and report
    /// placement quality (broken nodes, scheduled tasks, utilisation, balance) as wca's simulator.
    Simulate(verwalter::placement::simulate::SimulateArgs),
}

/// `verwalter generate ...`: parsed apart from [`Cli`], so that neither its help, nor the man
/// pages and completions made from it, show this packaging tool.
#[derive(Debug, Parser)]
#[command(
    name = "verwalter generate",
    bin_name = "verwalter generate",
    about = "Write the man pages and shell completions the packages ship."
)]
struct GenerateCli {
    #[command(subcommand)]
    what: Generate,
}

#[derive(Debug, Subcommand)]
enum Generate {
    /// Man pages: verwalter.1 and verwalter-<command>.1 for each command, into DIR.
    Man {
        #[arg(value_name = "DIR")]
        out_dir: PathBuf,
    },
    /// The completion script for SHELL, on standard output.
    Completions { shell: clap_complete::Shell },
}

#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("source")
        .args(["vars", "schedule", "check_dir"])
        .multiple(true)
        .required(true)
))]
struct RenderCliArgs {
    /// Config dir to use
    #[arg(long, value_name = "DIR", default_value = defaults::CONFIG_DIR)]
    config_dir: PathBuf,
    /// Role to render
    #[arg(long, required_unless_present = "check_dir")]
    role: Option<String>,
    /// The role's variables (JSON or YAML object with `template`)
    #[arg(long, value_name = "FILE")]
    vars: Option<PathBuf>,
    /// A schedule (as served by /v1/schedule) to take the role's variables from
    #[arg(long, value_name = "FILE", requires = "hostname", conflicts_with_all = ["vars", "check_dir"])]
    schedule: Option<PathBuf>,
    /// The node to render for (with --schedule)
    #[arg(long)]
    hostname: Option<String>,
    /// Show the commands instead of running them
    #[arg(short = 'n', long)]
    dry_run: bool,
    /// Parse a template dir and render each template with --vars (or no variables)
    #[arg(short = 'C', long, value_name = "DIR")]
    check_dir: Option<PathBuf>,
    /// Time limit of each command, in seconds
    #[arg(long, default_value_t = defaults::COMMAND_TIMEOUT.as_secs())]
    command_timeout: u64,
    /// Shadow render: render the role again with this template dir (web/v2) or version (v2)
    /// and print the file diff; no command runs
    #[arg(long, value_name = "TEMPLATE", conflicts_with = "check_dir")]
    shadow: Option<String>,
    /// Shadow render with the role's variables from this schedule (a shadow scheduler's) for
    /// the same --hostname
    #[arg(long, value_name = "FILE", requires = "schedule")]
    shadow_schedule: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct OfflineArgs {
    /// Config dir to use
    #[arg(long, value_name = "DIR", default_value = defaults::CONFIG_DIR)]
    config_dir: PathBuf,
    /// `current_host` for the scheduler [default: the system's host name]
    #[arg(long)]
    hostname: Option<String>,
    /// `current_id` for the scheduler [default: /etc/machine-id, or zeros]
    #[arg(long, value_name = "HEX")]
    override_machine_id: Option<String>,
    /// Do not run the queries of scheduler/v1/metrics.yaml (`state.metrics` is then `{}`)
    #[arg(long)]
    no_metrics: bool,
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    #[command(flatten)]
    offline: OfflineArgs,
    /// Check this placement config (wca-scheduler's config.yaml) instead of the config dir
    #[arg(long, value_name = "FILE")]
    placement_config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct ScheduleArgs {
    #[command(flatten)]
    offline: OfflineArgs,
    /// Scheduler input as served by `/v1/scheduler_input` (replaces runtime, peers, parents...)
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
}

fn main() -> ExitCode {
    verwalter::schedule::lua::allocator::tune();
    let args: Vec<_> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "generate") {
        return generate(GenerateCli::parse_from(&args[1..]).what);
    }
    let cli = match Cli::from_arg_matches(&cli_command().get_matches()) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    match cli.command {
        Some(Command::Run(args)) => run(&args),
        None => run(&cli.run),
        Some(Command::Check(args)) => {
            init_logs("warn");
            match &args.placement_config {
                Some(file) => verwalter::placement::check::check_file(file),
                None => check(&args.offline),
            }
        }
        Some(Command::Schedule(args)) => {
            init_logs("warn");
            schedule(&args)
        }
        Some(Command::Render(args)) => {
            init_logs("warn");
            render(args)
        }
        Some(Command::Placement(PlacementArgs {
            command: PlacementCommand::Simulate(args),
        })) => match verwalter::placement::simulate::run(&args) {
            Ok(report) => {
                print!("{report}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Extender(args)) => {
            // The config's `loggers:` (wca's) shape the log filter, so it is read first.
            let setup = verwalter::placement::extender::ExtenderSetup::from_flags(&args);
            let loggers = setup
                .as_ref()
                .map(|s| s.loggers.clone())
                .unwrap_or_default();
            let plan = verwalter_placement::loggers::plan(&loggers);
            let rust_log = std::env::var_os("RUST_LOG").is_some();
            let directives = if rust_log {
                &[][..]
            } else {
                &plan.directives[..]
            };
            init_logs_with("info", None, directives);
            if rust_log && !loggers.is_empty() {
                tracing::warn!(
                    "loggers: not applied: RUST_LOG is set and takes precedence over the \
                     config's loggers"
                );
            } else {
                for line in &plan.refused {
                    tracing::warn!("{line}");
                }
                if !plan.directives.is_empty() {
                    tracing::info!(filter = %plan.directives.join(","), "loggers: applied.");
                }
            }
            extender(setup)
        }
        Some(Command::Shadow(args)) => {
            init_logs("warn");
            verwalter::schedule::shadow::cli::run(&args)
        }
        Some(Command::Graph(args)) => match &args.command {
            Some(verwalter::ernest::builds::GraphSubcommand::Builds(command)) => {
                init_logs("warn");
                match verwalter::ernest::builds::run(command) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(error) => {
                        eprintln!("verwalter graph builds: {error}");
                        ExitCode::FAILURE
                    }
                }
            }
            None => {
                init_logs("info");
                graph(&args)
            }
        },
    }
}

/// The command line as parsed, with `verwalter run`'s defaults in its help (the man pages and
/// completions are made from this too).
fn cli_command() -> clap::Command {
    verwalter::config::with_defaults(Cli::command())
        .mut_subcommand("run", verwalter::config::with_defaults)
}

/// Sections of verwalter.1 that clap does not know: the files the package installs.
const MAN_FILES: &str = r#".SH FILES
.TP
.I /etc/verwalter.d/settings.yaml
The settings file the packaged systemd unit passes with \fB\-\-settings\fR (a commented
default; its keys are in running.md).
.TP
.I /etc/verwalter.d/api-token
The API token every request that changes something needs, made at install (root's alone).
.TP
.I /etc/verwalter/
The config dir: \fBscheduler/v1/main.lua\fR, \fBruntime/\fR, \fBtemplates/\fR,
\fBsandbox/\fR, \fBfrontend/\fR.
.TP
.I /var/lib/verwalter/
The storage dir: the schedule in force, applied hashes, backups, pending actions.
.TP
.I /var/log/verwalter/
The deployment log.
.TP
.I /usr/lib/systemd/system/verwalter.service
The systemd unit.
.SH EXIT STATUS
0: stopped by SIGTERM or SIGINT, or the command succeeded; 1: \fBcheck\fR found problems, or
\fBschedule\fR or \fBrender\fR failed; 2: bad command line; 3: the daemon cannot start (invalid
settings among others: the packaged unit does not restart it). The full table is in running.md.
.SH SEE ALSO
.BR systemctl (1),
.BR journalctl (1);
/usr/share/doc/verwalter/running.md (flags, settings, exit codes) and packaging.md
"#;

/// What verwalter.1 says under DESCRIPTION.
const MAN_ABOUT: &str = "verwalter keeps a cluster's services configured. Every node runs the daemon \
(`verwalter run`, or flags without a command as verwalter 0.13 took them); the nodes elect a \
leader, the leader runs the Lua scheduler of the config dir, and every node renders and applies \
the roles the schedule gives it. `check`, `schedule` and `render` do the same steps offline.";

fn generate(what: Generate) -> ExitCode {
    match what {
        Generate::Man { out_dir } => {
            let mut command = cli_command()
                .long_about(MAN_ABOUT)
                .disable_help_subcommand(true);
            command.build();
            let mut pages = vec![(command.clone(), true)];
            pages.extend(command.get_subcommands().map(|c| (c.clone(), false)));
            for (page, top) in pages {
                let man = clap_mangen::Man::new(page).manual("verwalter manual");
                let mut text = Vec::new();
                let written = man.render(&mut text).and_then(|()| {
                    if top {
                        text.extend_from_slice(MAN_FILES.as_bytes());
                    }
                    std::fs::write(out_dir.join(man.get_filename()), &text)
                });
                if let Err(e) = written {
                    eprintln!("verwalter generate man: {}: {e}", out_dir.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Generate::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cli_command(), "verwalter", &mut script);
            match std::io::Write::write_all(&mut std::io::stdout(), &script) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("verwalter generate completions: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn render(args: RenderCliArgs) -> ExitCode {
    use verwalter::render::cli;
    if let Some(dir) = &args.check_dir {
        let sample = match &args.vars {
            Some(path) => match cli::role_vars(&cli::RenderArgs {
                config_dir: args.config_dir.clone(),
                role: args.role.clone().unwrap_or_else(|| "check".into()),
                vars: cli::VarsSource::File(path.clone()),
                dry_run: true,
                timeout: std::time::Duration::from_secs(args.command_timeout),
            }) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("verwalter render: {e}");
                    return ExitCode::FAILURE;
                }
            },
            None => serde_json::Map::new(),
        };
        let problems = cli::check_dir(dir, sample);
        for p in &problems {
            eprintln!("{p}");
        }
        return if problems.is_empty() {
            println!("{}: ok", dir.display());
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let vars = match (&args.vars, &args.schedule, &args.hostname) {
        (Some(path), _, _) => cli::VarsSource::File(path.clone()),
        (None, Some(file), Some(hostname)) => cli::VarsSource::Schedule {
            file: file.clone(),
            hostname: hostname.clone(),
        },
        _ => {
            eprintln!("verwalter render: give --vars FILE, or --schedule FILE with --hostname");
            return ExitCode::from(2);
        }
    };
    let render_args = cli::RenderArgs {
        config_dir: args.config_dir,
        role: args.role.unwrap_or_default(),
        vars,
        dry_run: args.dry_run,
        timeout: std::time::Duration::from_secs(args.command_timeout),
    };
    if args.shadow.is_some() || args.shadow_schedule.is_some() {
        let shadow = args.shadow.as_deref();
        return match cli::shadow(&render_args, shadow, args.shadow_schedule.as_deref()) {
            Ok(result) => {
                cli::print_shadow(&result);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("verwalter render: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("verwalter render: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::render(&render_args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("verwalter render: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logs(default: &str) {
    init_logs_as(default, None);
}

/// Logs to stderr at `default` (or `RUST_LOG`); with `id`, each line starts with it
/// (`--log-id`, as verwalter 0.13 had it for several nodes logging to one place).
fn init_logs_as(default: &str, id: Option<&str>) {
    init_logs_with(default, id, &[]);
}

/// [`init_logs_as`] with `directives` (`target=level`) added to the filter.
fn init_logs_with(default: &str, id: Option<&str>, directives: &[String]) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    for directive in directives {
        match directive.parse() {
            Ok(d) => filter = filter.add_directive(d),
            Err(error) => eprintln!("log filter: {directive}: {error}"),
        }
    }
    // async-nats's debug lines show the server's URL whole, a password in it included: at most
    // info for it unless RUST_LOG names it.
    let named = std::env::var("RUST_LOG").is_ok_and(|f| f.contains("async_nats"));
    let verbose = filter
        .max_level_hint()
        .is_none_or(|level| level > tracing_subscriber::filter::LevelFilter::INFO);
    let filter = if named || !verbose {
        filter
    } else {
        filter.add_directive("async_nats=info".parse().expect("a valid directive"))
    };
    let format = WithId {
        id: id.map(|id| format!("{id} ")),
        inner: tracing_subscriber::fmt::format(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .event_format(format)
        .init();
}

/// The default line format, after an optional prefix.
struct WithId<F> {
    id: Option<String>,
    inner: F,
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for WithId<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        if let Some(id) = &self.id {
            writer.write_str(id)?;
        }
        self.inner.format_event(ctx, writer, event)
    }
}

fn run(args: &RunArgs) -> ExitCode {
    // With --log-id the machine id must be known first; settings problems go to stderr either way.
    let loaded = Config::load(args);
    let id = match (&loaded, args.log_id) {
        (Ok(config), true) => Some(config.machine_id.as_str()),
        _ => None,
    };
    init_logs_as("info", id);
    let config = match loaded {
        Ok(config) => config,
        Err(error) => {
            eprintln!("verwalter: {error}");
            return ExitCode::from(3);
        }
    };
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    if args.use_sudo {
        tracing::warn!(
            "--use-sudo is ignored: rendering runs inside the daemon, which needs the rights its \
             apply commands need (run it as root, as the packaged unit does)."
        );
    }
    run_until_signal("verwalter", Some(2), |shutdown| async move {
        match verwalter::daemon::run(config, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                // One line with the cause, for the operator and the journal; the status says
                // which kind of failure it was (docs/running.md#exit-codes).
                eprintln!("verwalter: {error}");
                ExitCode::from(error.exit_code())
            }
        }
    })
}

/// Runs `work` on a multi-threaded runtime (`workers` threads, or one per core the process may
/// run on) until it ends; SIGTERM or SIGINT cancel the token it gets. A runtime that cannot start
/// is exit status 3, with `who` naming the command.
fn run_until_signal<F, Fut>(who: &str, workers: Option<usize>, work: F) -> ExitCode
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ExitCode>,
{
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{who}: cannot start the async runtime: {error}");
            return ExitCode::from(3);
        }
    };
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("Shutting down.");
            signals.cancel();
        });
        work(shutdown).await
    })
}

/// `verwalter extender`: exit status 3 when it cannot start (as the daemon), 0 after a signal.
fn extender(setup: Result<verwalter::placement::extender::ExtenderSetup, String>) -> ExitCode {
    use verwalter::placement::extender::run;
    let setup = match setup {
        Ok(setup) => setup,
        Err(problem) => {
            eprintln!("verwalter extender: {problem}");
            return ExitCode::from(3);
        }
    };
    // One worker per core it may run on (`taskset` and cgroup CPU sets count): the extender is
    // the whole process, and its requests are CPU-bound.
    run_until_signal("verwalter extender", None, |shutdown| async move {
        match run(setup, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("verwalter {error}");
                ExitCode::from(3)
            }
        }
    })
}

/// `verwalter graph`: exit status 3 when it cannot start (as the daemon), 0 after a signal.
fn graph(args: &verwalter::ernest::GraphFlags) -> ExitCode {
    // Two workers: one loop and its NATS connection; file writes go to the blocking pool.
    run_until_signal("verwalter graph", Some(2), |shutdown| async move {
        match verwalter::ernest::run(args, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("verwalter graph: {error}");
                ExitCode::from(3)
            }
        }
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The scheduler input an offline run uses: the config dir's runtime, no peers, no parents, and
/// the queries of `metrics.yaml` run once (unless `--no-metrics`; a failed query is a warning).
fn offline_input(args: &OfflineArgs, inputs: &Inputs) -> Result<SchedulerInput, String> {
    let runtime = inputs.runtime.clone();
    // An offline run on a workstation has no use for the real machine id: without one it goes
    // on with zeros, saying so (the daemon refuses to start instead).
    let current_id = match identity::machine_id(args.override_machine_id.as_deref(), None) {
        Ok(id) => id,
        Err(problem) if args.override_machine_id.is_none() => {
            tracing::warn!("{problem}; current_id is 32 zeros");
            "0".repeat(32)
        }
        Err(problem) => return Err(problem),
    };
    let current_host = identity::hostname(args.hostname.as_deref(), None)?;
    let now = SystemClock.now_ms();
    let declared = inputs.metrics.as_deref().filter(|_| !args.no_metrics);
    let (metrics, warnings) = verwalter::schedule::scheduler_metrics::offline_view(declared, now);
    for warning in warnings {
        eprintln!("warning: {}: {warning}", args.config_dir.display());
    }
    Ok(SchedulerInput {
        now,
        current_host,
        current_id,
        parents: Vec::new(),
        actions: Default::default(),
        runtime,
        peers: Default::default(),
        metrics,
        datacenters: None,
    })
}

fn check(args: &OfflineArgs) -> ExitCode {
    let dir = &args.config_dir;
    let inputs = read_inputs(dir);
    let mut problems: Vec<String> = inputs
        .errors
        .iter()
        .map(|e| format!("{}: {e}", dir.display()))
        .collect();
    let input = offline_input(args, &inputs);
    if let Err(problem) = &input {
        problems.push(problem.clone());
    }
    problems.extend(
        verwalter::render::check_template_dirs(dir)
            .into_iter()
            .map(|p| format!("{}: {p}", dir.display())),
    );
    let has_scheduler = scheduler_dir(dir).join("main.lua").is_file()
        || verwalter::schedule::wasm::has_wasm_scheduler(dir);
    if let (Ok(input), true) = (input, has_scheduler) {
        match run_scheduler_once(dir, input.clone()) {
            Ok(output) => {
                let schedule =
                    Schedule::from_data(output.data, input.now, input.current_id.clone());
                let host = &input.current_host;
                // The roles this node would render: `query.wasm`'s, if there is one.
                let derived = verwalter::schedule::wasm::query::derive_offline(
                    dir,
                    &schedule,
                    host,
                    &verwalter_controllers::render::deployment_id(),
                );
                let view = match derived {
                    Ok(Some(roles)) => Some(vars::roles_view(schedule.data.tree(), host, roles)),
                    Ok(None) => None,
                    Err(e) => {
                        problems.push(format!("{}: {}", dir.display(), e.message));
                        Some(serde_json::Value::Null)
                    }
                };
                let data = view.as_ref().unwrap_or(schedule.data.tree());
                // Every role this node would render must have usable variables, resolvable
                // `$(role.path)` references and dependencies it can follow: the errors a
                // render pass would fail it with.
                for problem in verwalter_controllers::render::check_schedule(data, host).problems()
                {
                    problems.push(format!("{}: schedule: {problem}", dir.display()));
                }
                if problems.is_empty() {
                    println!(
                        "{}: ok; the scheduler returned a schedule with hash {}",
                        dir.display(),
                        schedule.hash
                    );
                }
            }
            Err(error) => problems.push(format!(
                "{}: scheduler ({}): {}",
                dir.display(),
                error.kind.label(),
                error.message
            )),
        }
    }
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        for problem in &problems {
            eprintln!("{problem}");
        }
        eprintln!("{} problem(s) found", problems.len());
        ExitCode::from(1)
    }
}

/// Runs the config dir's scheduler once: `scheduler.wasm` when it exists, else `main.lua`.
fn run_scheduler_once(
    dir: &Path,
    input: SchedulerInput,
) -> Result<
    verwalter_controllers::state::SchedulerOutput,
    verwalter_controllers::machinery::ports::SchedulerError,
> {
    if verwalter::schedule::wasm::has_wasm_scheduler(dir) {
        verwalter::schedule::wasm::WasmRun::load(dir, Limits::default().into())
            .and_then(|mut run| run.run(&input))
    } else {
        verwalter::schedule::lua::run_once(
            &scheduler_dir(dir),
            SCHEDULER_DIR,
            dir,
            input,
            Limits::default(),
        )
    }
}

fn read_input_file(path: &Path) -> Result<SchedulerInput, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}:{}: {e}", path.display(), e.line()))
}

fn schedule(args: &ScheduleArgs) -> ExitCode {
    let dir = &args.offline.config_dir;
    let input = match &args.input {
        Some(path) => match read_input_file(path) {
            Ok(input) => input,
            Err(problem) => {
                eprintln!("{problem}");
                return ExitCode::from(1);
            }
        },
        None => {
            let inputs = read_inputs(dir);
            for error in &inputs.errors {
                eprintln!("warning: {}: {error}", dir.display());
            }
            match offline_input(&args.offline, &inputs) {
                Ok(input) => input,
                Err(problem) => {
                    eprintln!("{problem}");
                    return ExitCode::from(1);
                }
            }
        }
    };
    let result = run_scheduler_once(dir, input.clone());
    match result {
        Ok(output) => {
            let schedule = Schedule::from_data(output.data, input.now, input.current_id.clone());
            println!(
                "{}",
                serde_json::to_string_pretty(&schedule).expect("a schedule serializes")
            );
            eprintln!("--- scheduler log ---\n{}", output.log);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("--- scheduler log ---\n{}", error.log);
            eprintln!(
                "{}: scheduler ({}): {}",
                dir.display(),
                error.kind.label(),
                error.message
            );
            ExitCode::from(1)
        }
    }
}
