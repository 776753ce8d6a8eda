//! `knit-agent`: initialize this machine as a Kubernetes node.

use clap::{Parser, Subcommand, ValueEnum};
use knit_agent::engine::{self, InitOptions};
use knit_agent::host::Host;
use knit_agent::journal::Journal;
use knit_agent::AgentError;
use knit_api::agent::AgentFailure;
use knit_api::{ErrorCode, NodeConfig, PhaseName};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "knit-agent",
    version,
    about = "knit's node agent: initializes a machine step by step and joins it to the cluster"
)]
struct Cli {
    /// Resolve every absolute path under DIR (tests, images, sandboxes).
    #[arg(long, global = true, default_value = "/")]
    root: PathBuf,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Json,
    Text,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Node(NodeCommand),
    #[command(flatten)]
    ControlPlane(ControlPlaneCommand),
}

/// What a person (or the stub) runs on the node.
#[derive(Subcommand)]
enum NodeCommand {
    /// Run every phase; resumes from the journal when run again.
    Init {
        #[arg(long)]
        config: PathBuf,
        /// Rerun this phase even if it is done.
        #[arg(long, value_name = "NAME")]
        force_phase: Option<String>,
        /// Stop after this phase.
        #[arg(long, value_name = "NAME")]
        stop_after: Option<String>,
    },
    /// Show what init would do, changing nothing.
    Plan {
        #[arg(long)]
        config: PathBuf,
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Show each phase's outcome from the journal.
    Status {
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Forget the journal (mounted disks and installed files stay). With
    /// `--undo`: put the machine back as it was before `init` — stop the
    /// services it started, undo its mounts and kernel settings, restore or
    /// remove the files it wrote, remove the directories it made.
    Reset {
        #[arg(long)]
        undo: bool,
    },
    /// Restart containerd, then kubelet (the control plane's node repair
    /// runs this first when a node stays NotReady).
    RestartServices,
    /// Run one service under the agent's supervisor (started by `init`
    /// where systemd is not PID 1; not for direct use).
    #[command(hide = true)]
    Supervise { name: String },
}

/// What the control plane runs through the provider's exec: one JSON
/// document on stdout ([`knit_api::agent`]).
#[derive(Subcommand)]
enum ControlPlaneCommand {
    /// Print the package cache's manifest on the data disk mounted at
    /// `--mount` (JSON; for the control plane).
    CacheManifest {
        #[arg(long, value_name = "DIR")]
        mount: String,
    },
    /// One step of preparing this node's data disk for a snapshot (JSON;
    /// run by the control plane's snapshot build).
    #[command(subcommand)]
    SnapshotPrepare(PrepareStep),
    /// Apply a pool's change in place (JSON; run by the control plane's
    /// rollout): the kubelet's settings and/or the Kubernetes package in
    /// `--update` (base64 of a NodeUpdate's JSON) are written into the
    /// NodeConfig, then init runs again: the kubelet's configuration is
    /// re-rendered (the new version's binaries installed) and the kubelet
    /// restarted.
    Update {
        #[arg(long)]
        config: PathBuf,
        #[arg(long, value_name = "BASE64")]
        update: String,
    },
    /// Preload a node image's root (`--root`): the package tarball
    /// verified and unpacked as a read-only cache, its binaries installed,
    /// and the agent the control plane serves beside them (JSON; run by
    /// `knit image preload`).
    Preload {
        /// The package tarball (`kubernetes-<version>-linux-amd64.tar.gz`).
        #[arg(long, value_name = "FILE")]
        package: PathBuf,
        #[arg(long, value_name = "VERSION")]
        kubernetes_version: String,
        /// The tarball's expected sha256 (hex).
        #[arg(long, value_name = "HEX")]
        sha256: Option<String>,
        /// The agent binary to preload.
        #[arg(long, value_name = "FILE")]
        agent: Option<PathBuf>,
    },
    /// Leave the pool: undo what `init` changed (as `reset --undo`), then
    /// remove the bootstrap files and this agent (JSON; for the control
    /// plane).
    Leave,
}

#[derive(Subcommand)]
enum PrepareStep {
    /// Stop the kubelet and wait until it is gone (containerd keeps running).
    StopKubelet,
    /// Check every file of the package cache against its manifest's sha256.
    VerifyPackage {
        #[arg(long, value_name = "DIR")]
        mount: String,
    },
    /// List the system images the node pulls.
    SystemImages,
    /// Pull images through CRI (`kubelet --ensure-images`) within a deadline.
    PullImages {
        #[arg(long, value_name = "SECONDS")]
        timeout_seconds: u64,
        /// Comma-separated image references.
        #[arg(long, value_delimiter = ',', required = true)]
        images: Vec<String>,
    },
    /// Scrub the data disk down to what a snapshot keeps (the image store
    /// and the package cache: `scrub::KEEP`; containerd's containers
    /// deleted and containerd stopped first), sync, trim, count the disk's
    /// used bytes.
    Clean {
        #[arg(long, value_name = "DIR")]
        mount: String,
    },
}

fn load_config(path: &PathBuf) -> Result<NodeConfig, AgentError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        AgentError::new(
            ErrorCode::FailConfig,
            format!("cannot read config {}: {e}", path.display()),
        )
    })?;
    NodeConfig::from_yaml(&text)
        .map_err(|e| AgentError::new(ErrorCode::FailConfig, format!("{}: {e}", path.display())))
}

/// Stops and starts one service knit-agent init set up, with the same
/// definition (a systemd unit: `systemctl restart`).
fn restart_service(host: &Host, name: &str) -> Result<(), AgentError> {
    use knit_agent::services;
    host.log
        .line("service", &format!("restarting {name} (node repair)"));
    if services::uses_systemd(host) {
        host.run(
            ErrorCode::FailCommand,
            "systemctl",
            &["restart", name],
            std::time::Duration::from_secs(60),
        )?;
        return Ok(());
    }
    // Read before stopping: stopping removes the supervisor's files.
    let path = host.path(&services::spec_file(name));
    let spec: services::ServiceSpec = std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_slice(&text).map_err(|e| e.to_string()))
        .map_err(|why| {
            AgentError::new(
                ErrorCode::FailCommand,
                format!(
                    "service {name}: cannot read its definition {}: {why} (did knit-agent init start it?)",
                    path.display()
                ),
            )
        })?;
    services::stop(host, name)?;
    services::ensure_running(host, &spec)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("KNIT_LOG").unwrap_or_else(|_| "warn".into());
    match cli.log_format {
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    let command = match cli.command {
        Command::ControlPlane(command) => return run_for_control_plane(&cli.root, command),
        Command::Node(command) => command,
    };
    match run(&cli.root, command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("knit-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a machine-facing answer: the JSON on success, else an
/// [`AgentFailure`] (also JSON, on stdout) with a failing exit status.
fn answer<T: serde::Serialize>(result: Result<T, AgentError>) -> ExitCode {
    let (text, code) = match &result {
        Ok(value) => (serde_json::to_string(value), ExitCode::SUCCESS),
        Err(e) => (
            serde_json::to_string(&AgentFailure {
                code: e.code.as_str().to_string(),
                message: e.message.clone(),
            }),
            ExitCode::FAILURE,
        ),
    };
    match text {
        Ok(text) => {
            println!("{text}");
            code
        }
        Err(e) => {
            eprintln!("knit-agent: cannot encode the answer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The subcommands the control plane runs and parses.
fn run_for_control_plane(root: &std::path::Path, command: ControlPlaneCommand) -> ExitCode {
    use knit_agent::prepare;
    match command {
        ControlPlaneCommand::CacheManifest { mount } => {
            answer(prepare::cache_manifest(&Host::without_log(root), &mount))
        }
        ControlPlaneCommand::SnapshotPrepare(step) => {
            let host = Host::new(root);
            match step {
                PrepareStep::StopKubelet => answer(prepare::stop_kubelet(&host)),
                PrepareStep::VerifyPackage { mount } => {
                    answer(prepare::verify_package(&host, &mount))
                }
                PrepareStep::SystemImages => answer(Ok(prepare::system_images(&host))),
                PrepareStep::PullImages {
                    timeout_seconds,
                    images,
                } => answer(prepare::pull_images(
                    &host,
                    &images,
                    std::time::Duration::from_secs(timeout_seconds.max(1)),
                )),
                PrepareStep::Clean { mount } => answer(prepare::clean(&host, &mount)),
            }
        }
        ControlPlaneCommand::Update { config, update } => {
            let host = Host::new(root);
            let result = knit_agent::update::decode(&update)
                .and_then(|u| knit_agent::update::run(&host, &config.to_string_lossy(), &u));
            if let Err(e) = &result {
                host.log.line("update", &e.to_string());
            }
            answer(result)
        }
        ControlPlaneCommand::Preload {
            package,
            kubernetes_version,
            sha256,
            agent,
        } => answer(knit_agent::package::preload(
            &Host::without_log(root),
            &package,
            &kubernetes_version,
            sha256.as_deref(),
            agent.as_deref(),
        )),
        ControlPlaneCommand::Leave => {
            let result = prepare::leave(&Host::without_log(root));
            let failed = result.as_ref().is_ok_and(|r| !r.failed.is_empty());
            let code = answer(result);
            if failed {
                ExitCode::FAILURE
            } else {
                code
            }
        }
    }
}

fn run(root: &std::path::Path, command: NodeCommand) -> Result<(), AgentError> {
    match command {
        NodeCommand::Init {
            config,
            force_phase,
            stop_after,
        } => {
            let host = Host::new(root);
            let config = load_config(&config).inspect_err(|e| {
                host.log.line("init", &e.to_string());
                host.log.record_error(e);
            })?;
            let options = InitOptions {
                force_phase: parse_phase("--force-phase", force_phase)?,
                stop_after: parse_phase("--stop-after", stop_after)?,
            };
            let journal = engine::init(&host, &config, &options)?;
            print_status(&journal);
            Ok(())
        }
        NodeCommand::Plan { config, output } => {
            let config = load_config(&config)?;
            let host = Host::without_log(root);
            let plan = engine::plan(&host, &config)?;
            match output {
                Output::Json => println!(
                    "{}",
                    knit_api::ser::json_pretty("the plan", &plan)
                        .map_err(|e| AgentError::new(ErrorCode::FailCommand, e.to_string()))?
                ),
                Output::Text => {
                    println!("node: {}", plan.node_name);
                    let disk = &plan.data_disk;
                    println!(
                        "data disk: {} {} ({})",
                        disk.action,
                        disk.device.as_deref().unwrap_or("-"),
                        disk.reason
                    );
                    println!("{:<24} {:<6} REASON", "PHASE", "ACTION");
                    for phase in &plan.phases {
                        println!(
                            "{:<24} {:<6} {}",
                            phase.name.as_str(),
                            phase.action,
                            phase.reason
                        );
                    }
                }
            }
            Ok(())
        }
        NodeCommand::Status { output } => {
            let host = Host::without_log(root);
            let journal = Journal::load(&host)?;
            match output {
                Output::Json => println!(
                    "{}",
                    knit_api::ser::json_pretty("the journal", &journal)
                        .map_err(|e| AgentError::new(ErrorCode::FailCommand, e.to_string()))?
                ),
                Output::Text => print_status(&journal),
            }
            Ok(())
        }
        NodeCommand::Supervise { name } => knit_agent::supervise::run(root, &name),
        NodeCommand::RestartServices => {
            let host = Host::new(root);
            for name in ["containerd", "kubelet"] {
                restart_service(&host, name)?;
                println!("restarted {name}");
            }
            Ok(())
        }
        NodeCommand::Reset { undo: true } => {
            let host = Host::without_log(root);
            let report = knit_agent::undo::undo(&host)?;
            for line in &report.done {
                println!("undone: {line}");
            }
            for line in &report.failed {
                eprintln!("not undone: {line}");
            }
            if report.failed.is_empty() {
                println!("the machine is back as it was before knit-agent init (its own files untouched; the agent's logs under /var/log kept)");
                Ok(())
            } else {
                Err(AgentError::new(
                    ErrorCode::FailCommand,
                    format!(
                        "{} change(s) could not be undone (listed above); run `knit-agent reset --undo` again once fixed",
                        report.failed.len()
                    ),
                ))
            }
        }
        NodeCommand::Reset { undo: false } => {
            let host = Host::without_log(root);
            let path = Journal::path(&host);
            match std::fs::remove_file(&path) {
                Ok(()) => println!("journal {} removed", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    println!("no journal at {}", path.display())
                }
                Err(e) => {
                    return Err(AgentError::new(
                        ErrorCode::FailJournal,
                        format!("remove {}: {e}", path.display()),
                    ))
                }
            }
            Ok(())
        }
    }
}

fn parse_phase(flag: &str, name: Option<String>) -> Result<Option<PhaseName>, AgentError> {
    let Some(name) = name else { return Ok(None) };
    PhaseName::parse(&name).map(Some).ok_or_else(|| {
        let names: Vec<&str> = PhaseName::ALL.iter().map(|p| p.as_str()).collect();
        AgentError::new(
            ErrorCode::FailConfig,
            format!(
                "{flag} {name}: not a phase; phases are {}",
                names.join(", ")
            ),
        )
    })
}

fn print_status(journal: &Journal) {
    println!("{:<24} {:<8} {:>9}  REASON", "PHASE", "RESULT", "DURATION");
    for &name in PhaseName::ALL {
        match journal.phases.get(&name) {
            Some(r) => {
                let result = format!("{:?}", r.outcome).to_lowercase();
                let reason = match (&r.error_code, &r.reason) {
                    (Some(code), Some(reason)) => format!("{code}: {reason}"),
                    (_, Some(reason)) => reason.clone(),
                    _ => String::new(),
                };
                println!(
                    "{:<24} {:<8} {:>7}ms  {}",
                    name.as_str(),
                    result,
                    r.duration_ms,
                    reason
                );
            }
            None => println!("{:<24} {:<8} {:>9}  ", name.as_str(), "pending", "-"),
        }
    }
}
