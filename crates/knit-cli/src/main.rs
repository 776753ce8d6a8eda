//! `knit`: the command-line interface. kubectl's conventions: verbs, kinds,
//! `-f FILE`, `-o wide|json|yaml`. This file holds the command line and
//! sends each verb to its module under `commands/`.

mod commands;
mod error;
mod jsonpath;
mod output;
mod selector;

use clap::{Parser, Subcommand, ValueEnum};
use commands::get::{GetFormat, GetOpts};
use commands::{
    apply, attach, cluster, events, exec, get, image, local, nodes, package, pools, registry,
    server, snapshot,
};
use error::{CliError, Result};
use output::Format;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "knit",
    version,
    about = "knit: node pools for Kubernetes, on the local cloud or your own"
)]
struct Cli {
    /// Client config (server URL, API token, CA); default $KNIT_CONFIG or ~/.knit/config.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    #[value(alias = "cluster")]
    Clusters,
    #[value(alias = "pool", alias = "nodepool", alias = "nodepools", alias = "np")]
    Pools,
    #[value(alias = "node", alias = "no")]
    Nodes,
    #[value(alias = "instance")]
    Instances,
    #[value(alias = "snapshot")]
    Snapshots,
    #[value(alias = "event", alias = "ev")]
    Events,
    #[value(alias = "jointoken")]
    Jointokens,
    #[value(alias = "server")]
    Servers,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum One {
    #[value(alias = "pools", alias = "nodepool")]
    Pool,
    #[value(alias = "nodes")]
    Node,
}

#[derive(Subcommand)]
enum ServerAction {
    /// Create the state directory, CA and admin token, and write the client config.
    #[command(args_override_self = true)]
    Init(server::ServerOpts),
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Start a server with embedded defaults in the background and write the client config.
    Up(server::ha::UpArgs),
    /// Run the server in the foreground.
    // A flag given twice keeps its last value: the command line's flags
    // come after a config file's, so they win.
    #[command(args_override_self = true)]
    Server {
        #[command(subcommand)]
        action: Option<ServerAction>,
        #[command(flatten)]
        opts: server::ServerOpts,
        /// Read flags from a YAML file: keys are the flags' long names
        /// (`state-dir: /var/lib/knit/server`). The command line wins over
        /// the file, the file over the environment.
        #[arg(long, env = "KNIT_SERVER_CONFIG_FILE")]
        config_file: Option<PathBuf>,
        /// Also write the client config for this server.
        #[arg(long)]
        write_config: bool,
    },
    /// List resources.
    Get {
        kind: Kind,
        name: Option<String>,
        /// wide | json | yaml | name | jsonpath=TEMPLATE (kubectl's:
        /// `{.items[*].metadata.name}`, `{range .items[*]}…{end}`).
        #[arg(short = 'o', long)]
        output: Option<GetFormat>,
        /// Only the items whose labels match (pools: metadata.labels;
        /// nodes: their pool's spec.labels and knit.dev/pool):
        /// `k=v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`.
        #[arg(short = 'l', long)]
        selector: Option<selector::Selector>,
        /// Print the table without its header line.
        #[arg(long)]
        no_headers: bool,
        /// After the list, print each item that is added or changes
        /// (asked every 2 s) until interrupted.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Show one pool or node in detail (a node's phase timeline);
    /// `-o json|yaml`: the same details as one document.
    Describe {
        kind: One,
        name: String,
        #[arg(short = 'o', long)]
        output: Option<Format>,
    },
    /// Create the resources in a file (NodePool, Cluster); `-` reads stdin.
    Create {
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Refuse a pool whose data-disk snapshot is stale.
        #[arg(long)]
        strict: bool,
        /// server: the server checks everything and stores nothing;
        /// client: the documents are only read.
        #[arg(long, value_enum, num_args = 0..=1, require_equals = true,
              default_value = "none", default_missing_value = "client")]
        dry_run: apply::DryRunMode,
    },
    /// Create or update the resources in a file (what `get -o yaml|json`
    /// prints is taken as it is).
    Apply {
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Refuse a pool whose data-disk snapshot is stale.
        #[arg(long)]
        strict: bool,
        /// server: the server checks everything and stores nothing;
        /// client: the documents are only read.
        #[arg(long, value_enum, num_args = 0..=1, require_equals = true,
              default_value = "none", default_missing_value = "client")]
        dry_run: apply::DryRunMode,
    },
    /// What `apply -f FILE` would change: a unified diff per object of the
    /// live object and what the server would store (its dry run). Exits 0
    /// when nothing would change, 1 when something would, 2 on an error.
    Diff {
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// As apply's --strict.
        #[arg(long)]
        strict: bool,
    },
    /// cluster-autoscaler against knit: `knit autoscaler cloud-config`
    /// writes a client certificate and prints its --cloud-config.
    Autoscaler {
        #[command(subcommand)]
        action: commands::autoscaler::AutoscalerAction,
    },
    /// Follow, pause, resume, restart or undo a pool's rollout (`knit
    /// rollout status pool NAME`).
    Rollout {
        #[command(subcommand)]
        action: commands::rollout::RolloutAction,
    },
    /// Set a pool's desired node count.
    Scale {
        kind: One,
        name: String,
        #[arg(long)]
        replicas: i64,
        /// Follow the nodes until every one is initialized (or failed).
        #[arg(long)]
        wait: bool,
        /// Release removed instances (false: stop and keep them).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        release: bool,
        /// Give up waiting after this long (`10m`, `90s`, or seconds).
        #[arg(long, default_value = "900", value_parser = commands::seconds)]
        timeout: u64,
    },
    /// Add existing instances to a pool (automatic mode: re-imaged with the pool's image).
    Attach(attach::AttachArgs),
    /// Print the command that adds one machine to a pool (manual mode: OS kept).
    AttachScript(attach::ScriptArgs),
    /// Delete a pool (scaled to 0 first) or remove a node from its pool.
    Delete {
        kind: One,
        name: String,
        /// Release the node's instance (false: stop and keep it). Default:
        /// release an instance knit created, keep one added by attach.
        #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        release: Option<bool>,
    },
    /// Run a command on a node's or instance's machine through its
    /// provider: `knit exec node NAME -- CMD…`; prints its output, exits
    /// with its code.
    Exec(exec::ExecArgs),
    /// A node's log, read from the instance through the provider.
    Logs {
        kind: One,
        name: String,
        /// init | user-data | error-code | error-msg
        #[arg(long, default_value = "init")]
        file: String,
        /// Keep printing what is appended (every 2 s) until the node is
        /// done with the log (init: initialized or failed; user-data: its
        /// outcome known), the node is gone, or interrupted.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Delete every pool, wait for the instances to go, stop the server `knit up` started
    /// and bring down its local cloud (bridge, metadata server, what is left in it).
    Down {
        /// Only stop the server; pools, instances and the local cloud stay.
        #[arg(long)]
        keep_instances: bool,
        /// Leave the local cloud up (`knit local down` removes it later).
        #[arg(long)]
        keep_cloud: bool,
        /// Wait this long for the instances to go (`10m`, `90s`, or seconds).
        #[arg(long, default_value = "600", value_parser = commands::seconds)]
        timeout: u64,
    },
    /// Data-disk snapshots: create from a pool, list, delete.
    Snapshot {
        #[command(subcommand)]
        action: snapshot::SnapshotAction,
    },
    /// API tokens with a role (viewer, operator, admin): create (the
    /// secret printed once), list, revoke. Needs an admin token.
    Token {
        #[command(subcommand)]
        action: commands::token::TokenAction,
    },
    /// The local OCI registry pools pull from (docker-registry on the
    /// local cloud's bridge): up [--seed], down, status.
    Registry {
        #[command(subcommand)]
        action: registry::RegistryAction,
    },
    /// The node OS image (Debian 12, built from Debian packages): build, show.
    Image {
        #[command(subcommand)]
        action: image::ImageAction,
    },
    /// Package mirror.
    Package {
        #[command(subcommand)]
        action: package::PackageAction,
    },
    /// The local cloud's verbs (runs the knit-local program installed beside knit).
    Local {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print a shell completion script: `source <(knit completion bash)`.
    Completion { shell: clap_complete::Shell },
    /// A field of the API objects: its type, default and description, and
    /// the fields under it (`knit explain nodepool.spec.drain`; the kinds:
    /// nodepool, cluster; docs/reference.md holds them all).
    Explain {
        /// KIND[.FIELD.PATH], e.g. `nodepool`, `nodepool.spec.repair`, `np.drain`.
        field: String,
    },
    /// The embedded cluster's admin kubeconfig: its path (`export
    /// KUBECONFIG=$(knit kubeconfig)`), or with --raw its contents.
    Kubeconfig {
        /// Print the file's contents instead of its path.
        #[arg(long)]
        raw: bool,
        /// The server's state directory (default: the one the client
        /// config records, else /var/lib/knit/server).
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
}

// The server allocates per request (HTTP, JSON, rows): at 1,000 nodes
// glibc's malloc, consolidating and unlinking free chunks, was about a
// sixth of its steady CPU (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match with_config_file(Cli::parse_from(&argv), &argv) {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("error [{}]: {e}", e.code());
            return ExitCode::FAILURE;
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error [{}]: {e}", e.code());
            ExitCode::FAILURE
        }
    }
}

/// `knit server --config-file FILE`: the command line parsed again with
/// the file's flags before its own.
fn with_config_file(cli: Cli, argv: &[std::ffi::OsString]) -> Result<Cli> {
    let Cmd::Server {
        config_file: Some(path),
        action,
        ..
    } = &cli.cmd
    else {
        return Ok(cli);
    };
    let words: &[&str] = match action {
        Some(ServerAction::Init(_)) => &["server", "init"],
        None => &["server"],
    };
    let extra = commands::server_config::file_args(path)?;
    match commands::server_config::insert_after(argv, words, extra) {
        Some(argv) => Ok(Cli::parse_from(argv)),
        None => Ok(cli),
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let client = || commands::client(&cli.config);
    match cli.cmd {
        Cmd::Up(args) => server::ha::up(&cli.config, args),
        Cmd::Server {
            action: Some(ServerAction::Init(opts)),
            ..
        } => server::init(&cli.config, &opts),
        Cmd::Server {
            action: None,
            opts,
            write_config,
            ..
        } => server::serve(&cli.config, opts, write_config),
        Cmd::Get {
            kind,
            name,
            output,
            selector,
            no_headers,
            watch,
        } => {
            let c = client()?;
            let name = name.as_deref();
            let opts = GetOpts {
                output,
                selector,
                no_headers,
                watch,
            };
            match kind {
                Kind::Clusters => cluster::get(&c, name, &opts),
                Kind::Pools => pools::get(&c, name, &opts),
                Kind::Nodes => nodes::get(&c, name, &opts),
                Kind::Instances => nodes::get_instances(&c, name, &opts),
                Kind::Snapshots => snapshot::get(&c, name, &opts),
                Kind::Events => events::get(&c, name, &opts),
                Kind::Jointokens => nodes::get_join_tokens(&c, name, &opts),
                Kind::Servers => get::servers(&c, name, &opts),
            }
        }
        Cmd::Describe { kind, name, output } => match kind {
            One::Pool => pools::describe(&client()?, &name, output),
            One::Node => nodes::describe(&client()?, &name, output),
        },
        Cmd::Create {
            file,
            strict,
            dry_run,
        } => apply::submit(&client()?, &file, false, strict, dry_run),
        Cmd::Apply {
            file,
            strict,
            dry_run,
        } => apply::submit(&client()?, &file, true, strict, dry_run),
        Cmd::Diff { file, strict } => apply::diff(&client()?, &file, strict),
        Cmd::Rollout { action } => commands::rollout::run(&client()?, action),
        Cmd::Autoscaler { action } => commands::autoscaler::run(&client()?, action),
        Cmd::Scale {
            kind,
            name,
            replicas,
            wait,
            release,
            timeout,
        } => {
            if kind != One::Pool {
                return Err(CliError::Usage(
                    "only pools scale: knit scale pool NAME --replicas N".into(),
                ));
            }
            pools::scale(
                &client()?,
                &name,
                replicas,
                release,
                wait.then_some(Duration::from_secs(timeout)),
            )
        }
        Cmd::Delete {
            kind,
            name,
            release,
        } => match kind {
            One::Pool => pools::delete(&client()?, &name),
            One::Node => nodes::delete(&client()?, &name, release),
        },
        Cmd::Exec(args) => Ok(exec::run(&client()?, args)?),
        Cmd::Logs {
            kind,
            name,
            file,
            follow,
        } => {
            if kind != One::Node {
                return Err(CliError::Usage(
                    "logs are per node: knit logs node NAME".into(),
                ));
            }
            if follow {
                nodes::follow(&client()?, &name, &file)
            } else {
                nodes::logs(&client()?, &name, &file)
            }
        }
        Cmd::Down {
            keep_instances,
            keep_cloud,
            timeout,
        } => server::down(
            &cli.config,
            keep_instances,
            keep_cloud,
            Duration::from_secs(timeout),
        ),
        Cmd::Snapshot { action } => snapshot::run(&client()?, action),
        Cmd::Token { action } => commands::token::run(&client()?, action),
        Cmd::Registry { action } => registry::run(action),
        Cmd::Attach(args) => attach::attach(&client()?, args),
        Cmd::AttachScript(args) => attach::script(&client()?, args),
        Cmd::Image { action } => image::run(action),
        Cmd::Package { action } => package::run(action),
        Cmd::Local { args } => local::run(&args),
        Cmd::Completion { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "knit", &mut script);
            // A closed pipe (`| head`) is not an error worth a message.
            match std::io::Write::write_all(&mut std::io::stdout(), &script) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(error::io("write the completion script")(e))
                }
                _ => Ok(ExitCode::SUCCESS),
            }
        }
        Cmd::Explain { field } => match knit_api::reference::explain(&field) {
            Ok(text) => {
                print!("{text}");
                Ok(ExitCode::SUCCESS)
            }
            Err(why) => Err(CliError::Usage(why)),
        },
        Cmd::Kubeconfig { raw, state_dir } => {
            cluster::kubeconfig(&cli.config, state_dir.as_deref(), raw)
        }
    }
}

#[cfg(test)]
mod describe_tests {
    use super::*;

    /// A config file's flags come first: the command line's win.
    #[test]
    fn the_command_line_wins_over_a_config_file() {
        let argv: Vec<std::ffi::OsString> = [
            "knit",
            "server",
            "--region",
            "from-file",
            "--ecs-security-group",
            "sg-file",
            "--parallelism",
            "3",
            "--region",
            "from-flag",
            "--ecs-security-group",
            "sg-a,sg-b",
        ]
        .iter()
        .map(Into::into)
        .collect();
        let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{e}"));
        let Cmd::Server { opts, .. } = cli.cmd else {
            panic!("not server")
        };
        let line: Vec<String> = opts
            .server_command_line()
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let after = |flag: &str| {
            let at = line
                .iter()
                .position(|a| a == flag)
                .unwrap_or_else(|| panic!("{flag} missing: {line:?}"));
            line[at + 1].clone()
        };
        assert_eq!(after("--region"), "from-flag");
        assert_eq!(after("--parallelism"), "3");
        assert!(!line.iter().any(|a| a == "sg-file"), "{line:?}");
    }

    /// `knit describe` takes `-o json|yaml` like `get` (before: an
    /// unexpected argument).
    #[test]
    fn describe_takes_an_output_format() {
        for (flag, want) in [("json", Format::Json), ("yaml", Format::Yaml)] {
            let cli = Cli::try_parse_from(["knit", "describe", "node", "n-1", "-o", flag])
                .unwrap_or_else(|e| panic!("-o {flag}: {e}"));
            match cli.cmd {
                Cmd::Describe { name, output, .. } => {
                    assert_eq!(name, "n-1");
                    assert!(output == Some(want), "-o {flag}");
                }
                _ => panic!("not describe"),
            }
        }
        let cli = Cli::try_parse_from(["knit", "describe", "pool", "workers"]).unwrap();
        assert!(matches!(cli.cmd, Cmd::Describe { output: None, .. }));
        assert!(Cli::try_parse_from(["knit", "describe", "pool", "w", "-o", "xml"]).is_err());
    }
}
