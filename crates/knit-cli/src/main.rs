//! `knit`: the command-line interface. kubectl's conventions: verbs, kinds,
//! `-f FILE`, `-o wide|json|yaml`.

mod attach;
mod exec;
mod image;
mod local_cloud;
mod output;
mod qemu_cloud;
mod registry;
mod snapshot;
mod wait;

use clap::{Args, Parser, Subcommand, ValueEnum};
use knit_client::{Client, ClientConfig, ClientError};
use knit_server::control::{Settings, DEFAULT_PORT};
use knit_server::ServerError;
use output::{age, cell, duration, table};
use serde::Deserialize as _;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The one error type of the CLI.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("{0}")]
    Server(#[from] ServerError),
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Failed(String),
    #[error("{0}")]
    Registry(#[from] knit_registry::RegistryError),
    #[error("{0}")]
    Local(#[from] knit_local::LocalError),
}

impl CliError {
    fn code(&self) -> String {
        match self {
            CliError::Client(e) => e.code().to_string(),
            CliError::Server(e) => e.code().to_string(),
            CliError::Usage(_) => "Usage".into(),
            CliError::Io { .. } => "IoError".into(),
            CliError::Failed(_) => "Failed".into(),
            CliError::Registry(e) => e.code().into(),
            CliError::Local(e) => e.code().into(),
        }
    }
}

type Result<T> = std::result::Result<T, CliError>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CliError {
    let what = what.into();
    move |source| CliError::Io { what, source }
}

#[derive(Parser)]
#[command(
    name = "knit",
    version,
    about = "knit: node pools for Kubernetes, on the local cloud or your own"
)]
struct Cli {
    /// Client config (server URL, admin token, CA); default $KNIT_CONFIG or ~/.knit/config.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Wide,
    Json,
    Yaml,
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
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum One {
    #[value(alias = "pools", alias = "nodepool")]
    Pool,
    #[value(alias = "nodes")]
    Node,
}

#[derive(Args, Clone)]
struct ServerOpts {
    /// Database, CA, admin token and package mirror.
    #[arg(long, env = "KNIT_STATE_DIR", default_value = "/var/lib/knit/server")]
    state_dir: PathBuf,
    /// Where to listen: ADDRESS:PORT, or several on one port separated by
    /// commas. Default: loopback and the local cloud's gateway (the first
    /// host of --local-subnet, e.g. 127.0.0.1:7443,10.213.0.1:7443); with
    /// --provider none, loopback only. 0.0.0.0:7443 listens everywhere.
    #[arg(long)]
    listen: Option<String>,
    /// Host instances use to reach the server (default: the local cloud's
    /// gateway when the server listens there or everywhere).
    #[arg(long)]
    advertise_address: Option<String>,
    /// local: the local cloud; qemu: QEMU VMs on the local cloud's bridge
    /// (docs/providers.md); ecs: Alibaba Cloud ECS in --region (key from
    /// ALIBABA_CLOUD_ACCESS_KEY_ID / ALIBABA_CLOUD_ACCESS_KEY_SECRET or a
    /// mode-0600 credentials file, never a flag); none: store and API only,
    /// no instance is made.
    #[arg(long, default_value = "local", value_parser = ["local", "qemu", "ecs", "none"])]
    provider: String,
    /// ECS region id (cn-shanghai …), with --provider ecs.
    #[arg(long, env = "KNIT_ECS_REGION")]
    region: Option<String>,
    /// ECS API endpoint instead of the region's public one (a private
    /// endpoint; tests' fake ECS).
    #[arg(long, env = "KNIT_ECS_ENDPOINT")]
    ecs_endpoint: Option<String>,
    /// vSwitch new ECS instances join (it fixes VPC and zone).
    #[arg(long, env = "KNIT_ECS_VSWITCH")]
    ecs_vswitch: Option<String>,
    /// Security groups of new ECS instances, comma-separated.
    #[arg(long, env = "KNIT_ECS_SECURITY_GROUPS", value_delimiter = ',')]
    ecs_security_group: Vec<String>,
    /// ECS image id used for pools whose image is `host`.
    #[arg(long, env = "KNIT_ECS_IMAGE")]
    ecs_image: Option<String>,
    /// Provider calls in flight at once.
    #[arg(long, default_value_t = 4)]
    parallelism: usize,
    /// Lifetime of a bootstrap token, in seconds.
    #[arg(long, default_value_t = 1800)]
    join_token_ttl: u64,
    /// embedded: serve the embedded Kubernetes API nodes join; none: nodes get no join material.
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "none"])]
    cluster: String,
    /// Port of the embedded Kubernetes API (on the listen address).
    #[arg(long, default_value_t = 6443)]
    cluster_port: u16,
    #[arg(
        long,
        env = "KNIT_LOCAL_STATE_DIR",
        default_value = "/var/lib/knit/local"
    )]
    local_state_dir: PathBuf,
    #[arg(long, env = "KNIT_LOCAL_BRIDGE", default_value = "knit0")]
    local_bridge: String,
    #[arg(long, env = "KNIT_LOCAL_SUBNET", default_value = "10.213.0.0/24")]
    local_subnet: String,
    #[arg(long, env = "KNIT_LOCAL_METADATA_PORT", default_value_t = 80)]
    local_metadata_port: u16,
}

#[derive(Subcommand)]
enum ServerAction {
    /// Create the state directory, CA and admin token, and write the client config.
    Init(ServerOpts),
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Start a server with embedded defaults in the background and write the client config.
    Up(ServerOpts),
    /// Run the server in the foreground.
    Server {
        #[command(subcommand)]
        action: Option<ServerAction>,
        #[command(flatten)]
        opts: ServerOpts,
        /// Also write the client config for this server.
        #[arg(long)]
        write_config: bool,
    },
    /// List resources.
    Get {
        kind: Kind,
        name: Option<String>,
        #[arg(short = 'o', long)]
        output: Option<Format>,
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
    },
    /// Create or update the resources in a file.
    Apply {
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Refuse a pool whose data-disk snapshot is stale.
        #[arg(long)]
        strict: bool,
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
        /// Give up waiting after this many seconds.
        #[arg(long, default_value_t = 900)]
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
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Data-disk snapshots: create from a pool, list, delete.
    Snapshot {
        #[command(subcommand)]
        action: snapshot::SnapshotAction,
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
        action: PackageAction,
    },
    /// The local cloud's verbs (runs the knit-local program installed beside knit).
    Local {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum PackageAction {
    /// Assemble the package mirror from what this machine has.
    Build {
        #[arg(long, env = "KNIT_STATE_DIR", default_value = "/var/lib/knit/server")]
        state_dir: PathBuf,
        #[arg(long, default_value = knit_api::DEFAULT_KUBERNETES_VERSION)]
        kubernetes_version: String,
        /// The agent binary (default: knit-agent beside knit).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// Shipped as bin/kubelet (default: knit-kubelet-sim beside knit).
        #[arg(long)]
        kubelet: Option<PathBuf>,
        /// Leave containerd, its shim, ctr and runc out of the tarball.
        #[arg(long)]
        no_runtime: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error [{}]: {e}", e.code());
            ExitCode::FAILURE
        }
    }
}

fn config_path(cli_config: &Option<PathBuf>) -> Result<PathBuf> {
    match cli_config {
        Some(p) => Ok(p.clone()),
        None => Ok(ClientConfig::default_path()?),
    }
}

fn client(cli_config: &Option<PathBuf>) -> Result<Client> {
    let config = ClientConfig::load(&config_path(cli_config)?)?;
    Ok(Client::new(&config)?)
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Cmd::Up(opts) => up(&cli.config, opts),
        Cmd::Server {
            action: Some(ServerAction::Init(opts)),
            ..
        } => server_init(&cli.config, &opts),
        Cmd::Server {
            action: None,
            opts,
            write_config,
        } => serve(&cli.config, opts, write_config),
        Cmd::Get { kind, name, output } => {
            get(&client(&cli.config)?, kind, name.as_deref(), output)
        }
        Cmd::Describe { kind, name, output } => {
            describe(&client(&cli.config)?, kind, &name, output)
        }
        Cmd::Create { file, strict } => submit(&client(&cli.config)?, &file, false, strict),
        Cmd::Apply { file, strict } => submit(&client(&cli.config)?, &file, true, strict),
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
            let c = client(&cli.config)?;
            let body = serde_json::json!({ "replicas": replicas, "release": release }).to_string();
            c.call(
                "POST",
                &format!("/api/v1/pools/{}/scale", seg(&name)),
                Some(&body),
            )?;
            println!("nodepool/{name} scaled to {replicas}");
            if wait {
                return wait::scale(&c, &name, Duration::from_secs(timeout));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Delete {
            kind,
            name,
            release,
        } => {
            let c = client(&cli.config)?;
            match kind {
                One::Pool => {
                    c.call("DELETE", &format!("/api/v1/pools/{}", seg(&name)), None)?;
                    println!("nodepool/{name} deleted (scaling to 0, then removed)");
                }
                One::Node => {
                    let path = match release {
                        Some(r) => format!("/api/v1/nodes/{}?release={r}", seg(&name)),
                        None => format!("/api/v1/nodes/{}", seg(&name)),
                    };
                    let answer = c.call("DELETE", &path, None)?;
                    println!(
                        "node/{name} deleted ({})",
                        match (answer["release"].as_bool(), answer["added"].as_bool()) {
                            (Some(true), _) => "instance released",
                            (_, Some(true)) =>
                                "instance kept: added by attach (--release to release it)",
                            _ => "instance kept",
                        }
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Exec(args) => Ok(exec::run(&client(&cli.config)?, args)?),
        Cmd::Logs { kind, name, file } => {
            if kind != One::Node {
                return Err(CliError::Usage(
                    "logs are per node: knit logs node NAME".into(),
                ));
            }
            let text = client(&cli.config)?
                .get_text(&format!("/api/v1/nodes/{}/logs?file={file}", seg(&name)))?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Down {
            keep_instances,
            keep_cloud,
            timeout,
        } => down(
            &cli.config,
            keep_instances,
            keep_cloud,
            Duration::from_secs(timeout),
        ),
        Cmd::Snapshot { action } => snapshot::run(&client(&cli.config)?, action),
        Cmd::Registry { action } => registry::run(action),
        Cmd::Attach(args) => attach::attach(&client(&cli.config)?, args),
        Cmd::AttachScript(args) => attach::script(&client(&cli.config)?, args),
        Cmd::Image { action } => image::run(action),
        Cmd::Package { action } => package(action),
        Cmd::Local { args } => local(&args),
    }
}

/// A name as one URL path segment (percent-encoded).
fn seg(name: &str) -> String {
    knit_client::segment(name)
}

// ---- server

/// The ECS provider from the server's flags; the key from the environment
/// or a credentials file (knit-ecs refuses one others can read).
fn ecs_provider(opts: &ServerOpts) -> Result<knit_server::provider::ecs::EcsProvider> {
    let region = opts.region.as_deref().ok_or_else(|| {
        CliError::Usage("--provider ecs needs --region <id> (e.g. cn-shanghai)".into())
    })?;
    let credentials =
        knit_ecs::Credentials::discover().map_err(|e| CliError::Failed(e.to_string()))?;
    let mut s = knit_server::provider::ecs::EcsSettings::new(region);
    s.endpoint = opts.ecs_endpoint.clone();
    s.v_switch_id = opts.ecs_vswitch.clone();
    s.security_group_ids = opts.ecs_security_group.clone();
    s.default_image = opts.ecs_image.clone();
    Ok(knit_server::provider::ecs::EcsProvider::new(
        s,
        credentials,
    )?)
}

/// The provider's gateway: where its instances reach this host.
fn gateway(opts: &ServerOpts) -> Result<Option<std::net::IpAddr>> {
    if opts.provider != "local" && opts.provider != "qemu" {
        return Ok(None);
    }
    Ok(Some(
        knit_server::provider::local::local_gateway(&opts.local_subnet)?.into(),
    ))
}

/// The addresses to listen on: `--listen`, else loopback and the gateway.
fn listen_addrs(opts: &ServerOpts) -> Result<Vec<std::net::SocketAddr>> {
    let Some(list) = &opts.listen else {
        let mut addrs = vec![std::net::SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))];
        if let Some(g) = gateway(opts)? {
            addrs.push(std::net::SocketAddr::new(g, DEFAULT_PORT));
        }
        return Ok(addrs);
    };
    let addrs = list
        .split(',')
        .map(|a| {
            a.trim().parse::<std::net::SocketAddr>().map_err(|_| {
                CliError::Usage(format!(
                    "--listen {list:?}: {a:?} must be ADDRESS:PORT (several: separated by commas)"
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if addrs.iter().any(|a| a.port() != addrs[0].port()) {
        return Err(CliError::Usage(format!(
            "--listen {list:?}: every address must use the same port"
        )));
    }
    Ok(addrs)
}

fn settings(opts: &ServerOpts) -> Result<Settings> {
    let mut s = Settings::new(opts.state_dir.clone());
    let addrs = listen_addrs(opts)?;
    s.listen = addrs[0];
    s.also_listen = addrs[1..].iter().map(|a| a.ip()).collect();
    s.advertise_host = opts.advertise_address.clone();
    s.parallelism = opts.parallelism.max(1);
    s.join_token_ttl = Duration::from_secs(opts.join_token_ttl);
    Ok(s)
}

/// The URL a CLI on this machine uses for the server's listen addresses.
fn local_url(opts: &ServerOpts) -> Result<String> {
    let addrs = listen_addrs(opts)?;
    let addr = addrs
        .iter()
        .find(|a| a.ip().is_loopback())
        .unwrap_or(&addrs[0]);
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        addr.ip().to_string()
    };
    Ok(format!("https://{host}:{}", addr.port()))
}

fn server_init(cli_config: &Option<PathBuf>, opts: &ServerOpts) -> Result<ExitCode> {
    let s = settings(opts)?;
    std::fs::create_dir_all(&s.state_dir)
        .map_err(io(format!("create {}", s.state_dir.display())))?;
    let pki = knit_server::pki::Pki::load_or_create(&s.pki_dir(), &[s.admin_token_path()])?;
    let token = knit_server::pki::load_or_create_token(&s.admin_token_path())?;
    let path = config_path(cli_config)?;
    ClientConfig {
        server: local_url(opts)?,
        token,
        ca_cert: pki.ca_pem,
        state_dir: Some(s.state_dir.display().to_string()),
        pid: None,
    }
    .save(&path)?;
    println!(
        "state in {}; client config written to {}",
        s.state_dir.display(),
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn serve(cli_config: &Option<PathBuf>, opts: ServerOpts, write_config: bool) -> Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
                // ureq prints request headers at debug: an STS token is one.
                .add_directive(
                    knit_ecs::LOG_DIRECTIVE
                        .parse()
                        .map_err(|e| CliError::Failed(format!("log filter: {e}")))?,
                ),
        )
        .with_writer(std::io::stderr)
        .init();
    let s = settings(&opts)?;
    // Listening on the gateway needs the bridge that holds it: made now,
    // as the first instance would (`knit down` removes it).
    if let Some(g) = gateway(&opts)? {
        if s.listen.ip() == g || s.also_listen.contains(&g) {
            knit_local::Cloud::open(local_config(&opts))
                .and_then(|c| c.network_up())
                .map_err(|e| {
                    CliError::Failed(format!(
                        "the local cloud's network ({} on {}), needed to listen on {g}: {e}",
                        opts.local_bridge, opts.local_subnet
                    ))
                })?;
        }
    }
    let provider: Option<Arc<dyn knit_server::provider::Provider>> = match opts.provider.as_str() {
        "local" => Some(Arc::new(knit_server::provider::local::LocalProvider::new(
            local_config(&opts),
        )?)),
        "ecs" => Some(Arc::new(ecs_provider(&opts)?)),
        "qemu" => Some(qemu_cloud::provider(local_config(&opts))?),
        _ => None,
    };
    let runtime = tokio::runtime::Runtime::new().map_err(io("start the async runtime"))?;
    runtime.block_on(async move {
        let embedded = match opts.cluster.as_str() {
            "embedded" => Some(Arc::new(start_cluster(&s, &opts).await?)),
            _ => None,
        };
        let join: Arc<dyn knit_server::bootstrap::ClusterJoin> = match &embedded {
            Some(e) => e.clone(),
            None => Arc::new(knit_server::bootstrap::NoCluster),
        };
        let server = knit_server::start(s, provider, join).await?;
        if write_config {
            let path = config_path(cli_config)?;
            ClientConfig {
                server: server.local_url.clone(),
                token: server.admin_token().to_string(),
                ca_cert: server.ca_pem().to_string(),
                state_dir: Some(opts.state_dir.display().to_string()),
                pid: Some(std::process::id()),
            }
            .save(&path)?;
        }
        eprintln!(
            "knit server on {} (instances use {})",
            server.local_url, server.control.advertise_url
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(io("install SIGTERM handler"))?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("knit server stopping");
        server.shutdown().await;
        if let Some(e) = embedded {
            e.stop();
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn local_config(opts: &ServerOpts) -> knit_local::Config {
    knit_local::Config {
        state_dir: opts.local_state_dir.clone(),
        bridge: opts.local_bridge.clone(),
        subnet: opts.local_subnet.clone(),
        metadata_port: opts.local_metadata_port,
        helper: None,
    }
}

/// Where the embedded Kubernetes API listens (one address): everywhere
/// when the server does, else the gateway when the server listens there
/// (instances must reach it), else the server's first address.
fn cluster_listen(
    s: &Settings,
    gateway: Option<std::net::IpAddr>,
    port: u16,
) -> std::net::SocketAddr {
    let ip = if s.listen.ip().is_unspecified() {
        s.listen.ip()
    } else {
        match gateway.filter(|g| s.listen.ip() == *g || s.also_listen.contains(g)) {
            Some(g) => g,
            None => s.listen.ip(),
        }
    };
    std::net::SocketAddr::new(ip, port)
}

/// The embedded Kubernetes API, on the server's address and the cluster
/// port, advertised at the host instances reach.
async fn start_cluster(
    s: &Settings,
    opts: &ServerOpts,
) -> Result<knit_server::cluster::EmbeddedJoin> {
    let gateway = gateway(opts)?;
    let listen = cluster_listen(s, gateway, opts.cluster_port);
    let addrs = [listen];
    let advertise = knit_server::server::advertise_host(s, &addrs, gateway);
    let mut cfg = knit_cluster::ClusterConfig::new(s.state_dir.join("cluster"), listen);
    cfg.advertise_address = Some(advertise);
    let cluster = knit_cluster::EmbeddedCluster::start(cfg)
        .await
        .map_err(|e| CliError::Failed(format!("embedded cluster on {listen}: {e}")))?;
    eprintln!(
        "embedded Kubernetes API at {} (admin kubeconfig {})",
        cluster.endpoint(),
        cluster.admin_kubeconfig_path().display()
    );
    Ok(knit_server::cluster::EmbeddedJoin::new(
        cluster,
        s.join_token_ttl,
    )?)
}

fn up(cli_config: &Option<PathBuf>, opts: ServerOpts) -> Result<ExitCode> {
    let path = config_path(cli_config)?;
    if listen_addrs(&opts)?.iter().any(|a| a.port() == 0) {
        // The config written below must name the port before the server runs.
        return Err(CliError::Usage(format!(
            "--listen {:?}: knit up needs a fixed port (use `knit server --write-config` for an ephemeral one)",
            opts.listen.as_deref().unwrap_or_default()
        )));
    }
    if let Ok(existing) = ClientConfig::load(&path) {
        if let Some(pid) = existing.pid.filter(|p| is_our_server(*p)) {
            println!(
                "a knit server is already running (pid {pid}); config {}",
                path.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
    }
    std::fs::create_dir_all(&opts.state_dir)
        .map_err(io(format!("create {}", opts.state_dir.display())))?;
    if opts.provider == "local" || opts.provider == "qemu" {
        // Before the server runs: `knit down` removes the cloud it made.
        local_cloud::record(&opts.state_dir, &local_config(&opts))?;
    }
    if opts.provider == "qemu" {
        qemu_cloud::record(&opts.state_dir, &local_config(&opts))?;
    }
    // Embedded defaults: a server without a package mirror could make no
    // node, so the first `up` assembles one from this machine.
    let mirror = Settings::new(opts.state_dir.clone()).mirror_dir();
    if !mirror.join("bin/knit-agent").is_file() {
        let no_runtime = which("containerd").is_none();
        println!(
            "assembling the package mirror in {}{}",
            mirror.display(),
            if no_runtime {
                " (containerd is not installed: package without a runtime)"
            } else {
                ""
            }
        );
        package(PackageAction::Build {
            state_dir: opts.state_dir.clone(),
            kubernetes_version: knit_api::DEFAULT_KUBERNETES_VERSION.to_string(),
            agent: None,
            kubelet: None,
            no_runtime,
        })?;
    }
    let log_path = opts.state_dir.join("server.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io(format!("open {}", log_path.display())))?;
    let log2 = log.try_clone().map_err(io("dup log"))?;
    let exe = std::env::current_exe().map_err(io("find the knit executable"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("server")
        .arg("--state-dir")
        .arg(&opts.state_dir)
        .args(["--provider", &opts.provider])
        .args([
            "--cluster",
            &opts.cluster,
            "--cluster-port",
            &opts.cluster_port.to_string(),
        ])
        .args(["--parallelism", &opts.parallelism.to_string()])
        .args(["--join-token-ttl", &opts.join_token_ttl.to_string()])
        .arg("--local-state-dir")
        .arg(&opts.local_state_dir)
        .args([
            "--local-bridge",
            &opts.local_bridge,
            "--local-subnet",
            &opts.local_subnet,
        ])
        .args([
            "--local-metadata-port",
            &opts.local_metadata_port.to_string(),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2);
    if let Some(a) = &opts.advertise_address {
        cmd.args(["--advertise-address", a]);
    }
    if let Some(l) = &opts.listen {
        cmd.args(["--listen", l]);
    }
    // The server outlives this command: its own session, no terminal.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(io("start the knit server"))?;
    let pid = child.id();
    let pki_ca = opts.state_dir.join("pki/ca.pem");
    let token_path = opts.state_dir.join("admin-token");
    let url = local_url(&opts)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(CliError::Failed(format!(
                "the server exited ({status}); see {}",
                log_path.display()
            )));
        }
        if let (Ok(ca), Ok(token)) = (
            std::fs::read_to_string(&pki_ca),
            std::fs::read_to_string(&token_path),
        ) {
            let config = ClientConfig {
                server: url.clone(),
                token: token.trim().to_string(),
                ca_cert: ca,
                state_dir: Some(opts.state_dir.display().to_string()),
                pid: Some(pid),
            };
            if let Ok(c) = Client::new(&config) {
                if matches!(c.raw("GET", "/healthz", None), Ok((200, _))) {
                    config.save(&path)?;
                    println!(
                        "knit server running (pid {pid}) at {url}; log {}; config {}",
                        log_path.display(),
                        path.display()
                    );
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: pid is the child we just started.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            return Err(CliError::Failed(format!(
                "the server did not answer within 30 s; see {}",
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// True when `pid` runs `knit server` (so a recycled PID is never signalled).
fn is_our_server(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"knit"))
                && args.get(1).is_some_and(|a| *a == b"server")
        })
        .unwrap_or(false)
}

fn down(
    cli_config: &Option<PathBuf>,
    keep_instances: bool,
    keep_cloud: bool,
    timeout: Duration,
) -> Result<ExitCode> {
    let path = config_path(cli_config)?;
    let mut config = ClientConfig::load(&path)?;
    let c = Client::new(&config)?;
    // A server `knit up` started that has died (killed, host reboot) cannot
    // delete its pools, nor say which instances were added by attach: stop
    // before anything is removed and say how to go on.
    if let Some(pid) = config.pid.filter(|pid| !is_our_server(*pid)) {
        if !keep_instances {
            return Err(CliError::Failed(format!(
                "knit server (pid {pid}) is not running, so its pools were not deleted and nothing was removed \
                 (the local cloud may hold instances added by attach, which knit never releases). \
                 Start it again with `knit up` and rerun `knit down`, or keep the instances with `knit down --keep-instances`, \
                 or remove the local cloud and every instance in it with `knit local down`"
            )));
        }
    }
    // Instances added by attach that the pools' deletion kept (SPEC §2).
    let mut added_kept: Vec<String> = Vec::new();
    if !keep_instances {
        let pools = c.get("/api/v1/pools")?;
        for p in pools["items"].as_array().into_iter().flatten() {
            let name = cell(&p["metadata"]["name"]);
            c.call("DELETE", &format!("/api/v1/pools/{}", seg(&name)), None)?;
            println!("nodepool/{name} deleted");
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let instances = c.get("/api/v1/instances")?;
            let left: Vec<String> = instances["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|i| i["state"] != "Detached")
                .map(|i| cell(&i["name"]))
                .collect();
            if left.is_empty() {
                added_kept = instances["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|i| i["added"] == true)
                    .map(|i| cell(&i["providerId"]))
                    .collect();
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(CliError::Failed(format!(
                    "instances still present after {} s: {}",
                    timeout.as_secs(),
                    left.join(", ")
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    match config.pid {
        Some(pid) if is_our_server(pid) => {
            // SAFETY: signalling the server process this config recorded, checked above.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while is_our_server(pid) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if is_our_server(pid) {
                // A server still running could make instances in a cloud
                // taken down under it.
                return Err(CliError::Failed(format!(
                    "knit server (pid {pid}) did not stop within 30 s; nothing else was removed"
                )));
            }
            println!("knit server (pid {pid}) stopped");
        }
        Some(pid) => println!("knit server (pid {pid}) is not running"),
        None => println!("this config has no server started by `knit up`; nothing to stop"),
    }
    // The registry `knit registry up` started for this server's state.
    if let Some(dir) = &config.state_dir {
        registry::stop_in(Path::new(dir))?;
    }
    config.pid = None;
    config.save(&path)?;
    if let Some(dir) = &config.state_dir {
        if keep_instances {
            println!("local cloud kept: its instances stay (--keep-instances)");
        } else if keep_cloud {
            println!("local cloud kept (--keep-cloud); `knit local down` removes it");
        } else if !added_kept.is_empty() {
            // Taking the cloud down would destroy the machines users added.
            println!(
                "local cloud kept: it holds instance(s) added by attach, which knit does not release: {}; `knit local down` removes the cloud and them",
                added_kept.join(", ")
            );
        } else {
            // VMs first: their taps are on the local cloud's bridge.
            qemu_cloud::down(Path::new(dir))?;
            local_cloud::down(Path::new(dir))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

// ---- get / describe

fn list_path(kind: Kind) -> &'static str {
    match kind {
        Kind::Clusters => "/api/v1/cluster",
        Kind::Pools => "/api/v1/pools",
        Kind::Nodes => "/api/v1/nodes",
        Kind::Instances => "/api/v1/instances",
        Kind::Snapshots => "/api/v1/snapshots",
        Kind::Events => "/api/v1/events",
        Kind::Jointokens => "/api/v1/jointokens",
    }
}

fn name_of(kind: Kind, item: &Value) -> String {
    match kind {
        Kind::Clusters | Kind::Pools => cell(&item["metadata"]["name"]),
        Kind::Snapshots => cell(&item["id"]),
        Kind::Jointokens => cell(&item["tokenId"]),
        Kind::Events => cell(&item["id"]),
        _ => cell(&item["name"]),
    }
}

fn get(c: &Client, kind: Kind, name: Option<&str>, format: Option<Format>) -> Result<ExitCode> {
    let answer = c.get(list_path(kind))?;
    let mut items: Vec<Value> = match kind {
        Kind::Clusters => vec![answer],
        _ => answer["items"].as_array().cloned().unwrap_or_default(),
    };
    if let Some(n) = name {
        items.retain(|i| name_of(kind, i) == n);
        if items.is_empty() {
            return Err(CliError::Failed(format!(
                "{} {n:?} not found",
                list_path(kind).rsplit('/').next().unwrap_or("")
            )));
        }
    }
    let doc = if name.is_some() && items.len() == 1 {
        items[0].clone()
    } else {
        serde_json::json!({ "items": items })
    };
    match format {
        Some(Format::Json) => print!("{}", output::json(&doc)),
        Some(Format::Yaml) => print!("{}", output::yaml(&doc)),
        wide => print!("{}", render_table(kind, &items, wide == Some(Format::Wide))),
    }
    Ok(ExitCode::SUCCESS)
}

fn render_table(kind: Kind, items: &[Value], wide: bool) -> String {
    let now = knit_server::store::now_ms();
    let ms = |v: &Value| v.as_i64().unwrap_or(now);
    let (headers, rows): (Vec<&str>, Vec<Vec<String>>) = match kind {
        Kind::Clusters => (
            vec![
                "NAME",
                "VERSION",
                "REGION",
                "EDITION",
                "QUOTA",
                "NETWORK",
                "API-SERVER",
            ],
            items
                .iter()
                .map(|i| {
                    let s = &i["spec"];
                    let quota = s["nodeQuota"].as_i64().unwrap_or(if s["edition"] == "pro" {
                        5000
                    } else {
                        10
                    });
                    vec![
                        cell(&i["metadata"]["name"]),
                        cell(&s["kubernetesVersion"]),
                        cell(&s["region"]),
                        cell(&s["edition"]),
                        quota.to_string(),
                        cell(&s["network"]["plugin"]),
                        cell(&s["apiServer"]),
                    ]
                })
                .collect(),
        ),
        Kind::Pools => {
            let mut h = vec![
                "NAME",
                "TYPE",
                "DESIRED",
                "INSTANCES",
                "RUNNING",
                "INITIALIZED",
                "READY",
                "AGE",
            ];
            if wide {
                h.extend(["FAILED", "INSTANCE-TYPES", "IMAGE", "DELETING"]);
            }
            let rows = items
                .iter()
                .map(|i| {
                    let st = &i["status"];
                    let mut r = vec![
                        cell(&i["metadata"]["name"]),
                        cell(&i["spec"]["type"]),
                        cell(&st["desired"]),
                        cell(&st["instances"]),
                        cell(&st["running"]),
                        cell(&st["initialized"]),
                        cell(&st["ready"]),
                        age(ms(&i["metadata"]["creationTimestampMs"]), now),
                    ];
                    if wide {
                        let types: Vec<String> = i["spec"]["instanceTypes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(cell)
                            .collect();
                        r.extend([
                            cell(&st["failed"]),
                            types.join(","),
                            cell(&i["spec"]["image"]),
                            cell(&st["deleting"]),
                        ]);
                    }
                    r
                })
                .collect();
            (h, rows)
        }
        Kind::Nodes => {
            let mut h = vec!["NAME", "STATUS", "POOL", "PHASE", "INITIALIZED", "AGE"];
            if wide {
                h.extend(["INSTANCE", "PROVIDER-ID", "INTERNAL-IP", "ERROR"]);
            }
            let rows = items
                .iter()
                .map(|i| {
                    let phase = format!("{}/{}", cell(&i["phase"]), cell(&i["phaseOutcome"]));
                    let mut r = vec![
                        cell(&i["name"]),
                        cell(&i["status"]),
                        cell(&i["pool"]),
                        phase,
                        cell(&i["initialized"]),
                        age(ms(&i["createdMs"]), now),
                    ];
                    if wide {
                        r.extend([
                            cell(&i["instance"]),
                            cell(&i["providerId"]),
                            cell(&i["ip"]),
                            cell(&i["errorCode"]),
                        ]);
                    }
                    r
                })
                .collect();
            (h, rows)
        }
        Kind::Instances => {
            let mut h = vec!["NAME", "POOL", "STATE", "PROVIDER-ID", "IP", "AGE"];
            if wide {
                h.extend(["TYPE", "LAST-ERROR"]);
            }
            let rows = items
                .iter()
                .map(|i| {
                    let mut r = vec![
                        cell(&i["name"]),
                        cell(&i["pool"]),
                        cell(&i["state"]),
                        cell(&i["providerId"]),
                        cell(&i["ip"]),
                        age(ms(&i["createdMs"]), now),
                    ];
                    if wide {
                        r.extend([cell(&i["instanceType"]), cell(&i["lastError"])]);
                    }
                    r
                })
                .collect();
            (h, rows)
        }
        Kind::Snapshots => (
            vec!["ID", "POOL", "KUBERNETES", "CONTAINERD", "SIZE", "AGE"],
            items
                .iter()
                .map(|i| {
                    vec![
                        cell(&i["id"]),
                        cell(&i["pool"]),
                        cell(&i["kubernetesVersion"]),
                        cell(&i["containerdVersion"]),
                        format!("{}Mi", i["sizeBytes"].as_i64().unwrap_or(0) >> 20),
                        age(ms(&i["createdMs"]), now),
                    ]
                })
                .collect(),
        ),
        Kind::Events => (
            vec!["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
            items
                .iter()
                .map(|i| {
                    vec![
                        age(ms(&i["atMs"]), now),
                        cell(&i["type"]),
                        cell(&i["reason"]),
                        format!(
                            "{}/{}",
                            cell(&i["objectKind"]).to_lowercase(),
                            cell(&i["objectName"])
                        ),
                        cell(&i["message"]),
                    ]
                })
                .collect(),
        ),
        Kind::Jointokens => (
            vec!["TOKEN-ID", "INSTANCE", "POOL", "EXPIRES", "USED"],
            items
                .iter()
                .map(|i| {
                    let expires = i["expiresMs"].as_i64().unwrap_or(0);
                    vec![
                        cell(&i["tokenId"]),
                        cell(&i["instance"]),
                        cell(&i["pool"]),
                        if expires > now {
                            format!("in {}", age(now, expires))
                        } else {
                            "expired".into()
                        },
                        if i["usedMs"].is_null() {
                            "no".into()
                        } else {
                            format!("{} ago", age(ms(&i["usedMs"]), now))
                        },
                    ]
                })
                .collect(),
        ),
    };
    if rows.is_empty() {
        return "No resources found.\n".to_string();
    }
    table(&headers, &rows)
}

/// A pool's instances and the last events of the pool, its instances and
/// its nodes (what `describe pool` shows).
fn pool_related(c: &Client, name: &str) -> Result<(Vec<Value>, Vec<Value>)> {
    let instances = c.get("/api/v1/instances")?;
    let mine: Vec<Value> = instances["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["pool"] == name)
        .cloned()
        .collect();
    let events = c.get("/api/v1/events?limit=1000")?;
    // The pool's own events, its instances' and its nodes'.
    let mut related_names: Vec<String> = mine.iter().map(|i| cell(&i["name"])).collect();
    let nodes = c.get("/api/v1/nodes")?;
    related_names.extend(
        nodes["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["pool"] == name)
            .map(|n| cell(&n["name"])),
    );
    let related: Vec<Value> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["objectName"] == name || related_names.contains(&cell(&e["objectName"])))
        .cloned()
        .collect();
    let last = related[related.len().saturating_sub(20)..].to_vec();
    Ok((mine, last))
}

/// `describe -o json|yaml`: a node's document as the API gives it
/// (timeline and caches included); a pool's with its `instances` and last
/// `events`.
fn describe_doc(c: &Client, kind: One, name: &str) -> Result<Value> {
    Ok(match kind {
        One::Node => c.get(&format!("/api/v1/nodes/{}", seg(name)))?,
        One::Pool => {
            let mut p = c.get(&format!("/api/v1/pools/{}", seg(name)))?;
            let (instances, events) = pool_related(c, name)?;
            p["instances"] = Value::Array(instances);
            p["events"] = Value::Array(events);
            p
        }
    })
}

fn describe(c: &Client, kind: One, name: &str, format: Option<Format>) -> Result<ExitCode> {
    match format {
        Some(Format::Json) => {
            print!("{}", output::json(&describe_doc(c, kind, name)?));
            return Ok(ExitCode::SUCCESS);
        }
        Some(Format::Yaml) => {
            print!("{}", output::yaml(&describe_doc(c, kind, name)?));
            return Ok(ExitCode::SUCCESS);
        }
        Some(Format::Wide) | None => {}
    }
    let now = knit_server::store::now_ms();
    match kind {
        One::Node => {
            let n = c.get(&format!("/api/v1/nodes/{}", seg(name)))?;
            println!("Name:          {}", cell(&n["name"]));
            println!("Pool:          {}", cell(&n["pool"]));
            println!(
                "Instance:      {} ({})",
                cell(&n["instance"]),
                cell(&n["providerId"])
            );
            println!("Internal IP:   {}", cell(&n["ip"]));
            println!("Status:        {}", cell(&n["status"]));
            println!("Initialized:   {}", cell(&n["initialized"]));
            println!(
                "User data:     {}",
                n["userData"]
                    .as_str()
                    .unwrap_or("not finished (or not known yet)")
            );
            if !n["errorCode"].is_null() {
                println!(
                    "Error:         {} {}",
                    cell(&n["errorCode"]),
                    cell(&n["error"])
                );
            }
            println!(
                "Age:           {}",
                age(n["createdMs"].as_i64().unwrap_or(now), now)
            );
            snapshot::describe_cache(&n);
            println!("Phase timeline:");
            let timeline = n["timeline"].as_array().cloned().unwrap_or_default();
            let first = timeline
                .first()
                .and_then(|t| t["atMs"].as_i64())
                .unwrap_or(0);
            let rows: Vec<Vec<String>> = timeline
                .iter()
                .filter(|t| t["outcome"] != "started")
                .map(|t| {
                    let at = t["atMs"].as_i64().unwrap_or(first);
                    let d = t["durationMs"].as_i64();
                    vec![
                        format!("+{}", duration(at - d.unwrap_or(0) - first)),
                        cell(&t["phase"]),
                        cell(&t["outcome"]),
                        d.map(duration).unwrap_or_else(|| "-".into()),
                        match (&t["errorCode"], &t["reason"]) {
                            (Value::Null, Value::Null) => String::new(),
                            (Value::Null, r) => cell(r),
                            (code, r) => format!(
                                "{} {}",
                                cell(code),
                                if r.is_null() { String::new() } else { cell(r) }
                            ),
                        },
                    ]
                })
                .collect();
            if rows.is_empty() {
                println!("  (no reports yet)");
            } else {
                for line in
                    table(&["START", "PHASE", "OUTCOME", "DURATION", "DETAIL"], &rows).lines()
                {
                    println!("  {line}");
                }
            }
            let running: Vec<String> = timeline
                .iter()
                .filter(|t| t["outcome"] == "started")
                .filter(|s| {
                    !timeline
                        .iter()
                        .any(|t| t["phase"] == s["phase"] && t["outcome"] != "started")
                })
                .map(|s| {
                    format!(
                        "{} (running for {})",
                        cell(&s["phase"]),
                        duration(now - s["atMs"].as_i64().unwrap_or(now))
                    )
                })
                .collect();
            if !running.is_empty() {
                println!("In progress:   {}", running.join(", "));
            }
        }
        One::Pool => {
            let p = c.get(&format!("/api/v1/pools/{}", seg(name)))?;
            let mut spec = p.clone();
            if let Some(obj) = spec.as_object_mut() {
                obj.remove("status");
            }
            print!("{}", output::yaml(&spec));
            println!("status:");
            for (k, v) in p["status"].as_object().into_iter().flatten() {
                println!("  {k}: {v}");
            }
            let (mine, related) = pool_related(c, name)?;
            println!("Instances:");
            print!("{}", render_table(Kind::Instances, &mine, true));
            println!("Events:");
            print!("{}", render_table(Kind::Events, &related, false));
        }
    }
    Ok(ExitCode::SUCCESS)
}

// ---- create / apply

fn read_input(file: &Path) -> Result<String> {
    if file == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(io("read stdin"))?;
        return Ok(s);
    }
    std::fs::read_to_string(file).map_err(io(format!("read {}", file.display())))
}

/// The server's warnings (e.g. a stale snapshot), as kubectl shows them.
fn print_warnings(v: &Value) {
    for w in v["warnings"].as_array().into_iter().flatten() {
        eprintln!("Warning: {}", cell(w));
    }
}

fn submit(c: &Client, file: &Path, apply: bool, strict: bool) -> Result<ExitCode> {
    let text = read_input(file)?;
    let mut failed = false;
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .map_err(|e| CliError::Usage(format!("{}: document {}: {e}", file.display(), i + 1)))?;
        if value.is_null() {
            continue;
        }
        let body = serde_yaml::to_string(&value).map_err(|e| CliError::Usage(e.to_string()))?;
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("")
            .to_string();
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or("")
            .to_string();
        let outcome = match kind.as_str() {
            "NodePool" if apply => c
                .call(
                    "PUT",
                    &format!("/api/v1/pools/{}?strict={strict}", seg(&name)),
                    Some(&body),
                )
                .map(|v| print_warnings(&v))
                .map(|_| "configured"),
            "NodePool" => c
                .call(
                    "POST",
                    &format!("/api/v1/pools?strict={strict}"),
                    Some(&body),
                )
                .map(|v| print_warnings(&v))
                .map(|_| "created"),
            "Cluster" => c
                .call("PUT", "/api/v1/cluster", Some(&body))
                .map(|_| "configured"),
            other => {
                eprintln!(
                    "error: document {}: kind {other:?} is not NodePool or Cluster",
                    i + 1
                );
                failed = true;
                continue;
            }
        };
        match outcome {
            Ok(what) => println!("{}/{name} {what}", kind.to_lowercase()),
            Err(e) => {
                eprintln!("error [{}]: {}/{name}: {e}", e.code(), kind.to_lowercase());
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

// ---- package, local

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(io("find the knit executable"))?;
    Ok(exe.with_file_name(name))
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn package(action: PackageAction) -> Result<ExitCode> {
    let PackageAction::Build {
        state_dir,
        kubernetes_version,
        agent,
        kubelet,
        no_runtime,
    } = action;
    let agent = match agent {
        Some(a) => a,
        None => sibling("knit-agent")?,
    };
    let kubelet = match kubelet {
        Some(k) => k,
        None => sibling("knit-kubelet-sim")?,
    };
    let mut runtime_bins = Vec::new();
    let mut containerd_version = String::new();
    if !no_runtime {
        for name in ["containerd", "containerd-shim-runc-v2", "ctr", "runc"] {
            let path = which(name).ok_or_else(|| {
                CliError::Failed(format!("{name} is not installed (apt-get install containerd runc), or pass --no-runtime"))
            })?;
            runtime_bins.push((name.to_string(), path));
        }
        let out = std::process::Command::new(&runtime_bins[0].1)
            .arg("--version")
            .output()
            .map_err(io("run containerd --version"))?;
        // "containerd github.com/containerd/containerd 1.6.20~ds1 …": the third word.
        containerd_version = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(2)
            .unwrap_or("")
            .to_string();
    }
    let summary = knit_server::mirror::build(&knit_server::mirror::PackageBuild {
        mirror_dir: Settings::new(state_dir).mirror_dir(),
        kubernetes_version,
        kubelet,
        agent,
        runtime_bins,
        containerd_version,
        images: knit_server::mirror::DEFAULT_SYSTEM_IMAGES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        cni_plugins: knit_server::mirror::LOCAL_CNI_PLUGINS
            .iter()
            .map(|name| {
                (
                    name.to_string(),
                    Path::new(knit_server::mirror::DEBIAN_CNI_DIR).join(name),
                )
            })
            .filter(|(_, path)| path.is_file())
            .collect(),
        network_config: Some((
            knit_server::mirror::LOCAL_NETWORK_CONFIG.0.to_string(),
            knit_server::mirror::LOCAL_NETWORK_CONFIG.1.to_string(),
        )),
    })?;
    println!(
        "{} ({} MiB, sha256 {})\nknit-agent sha256 {}",
        summary.tarball.display(),
        summary.tarball_bytes >> 20,
        summary.tarball_sha256,
        summary.agent_sha256
    );
    Ok(ExitCode::SUCCESS)
}

fn local(args: &[String]) -> Result<ExitCode> {
    let program = sibling("knit-local")?;
    if !program.is_file() {
        return Err(CliError::Failed(format!(
            "{} is missing: build the knit-local crate",
            program.display()
        )));
    }
    let status = std::process::Command::new(&program)
        .args(args)
        .status()
        .map_err(io(format!("run {}", program.display())))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
    })
}

#[cfg(test)]
mod describe_tests {
    use super::*;

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
