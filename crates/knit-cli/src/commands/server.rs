//! `knit server`, `knit server init`, `knit up` and `knit down`: the
//! server's settings from the command line, running it in the foreground
//! or in the background, and taking down what `up` started.

use super::{clouds, config_path, package, registry};
use crate::error::{io, CliError, Result};
use clap::Args;
use knit_api::state::InstanceState;
use knit_client::{Client, ClientConfig};
use knit_server::features::{self, Feature};
use knit_server::provider::ProviderKind;
use knit_server::{Settings, DEFAULT_PORT};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// `knit up --ha N`: PostgreSQL, N servers and HAProxy (docs/ha.md).
#[path = "ha/mod.rs"]
pub mod ha;

/// `knit server`'s settings. `knit up` takes the same options (flattened in
/// its own arguments) and starts the server from them with
/// [`ServerOpts::server_command_line`]: one type, so no setting of the
/// server can be forgotten on the way.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct ServerOpts {
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
    #[arg(long, default_value = "local", value_parser = ProviderKindParser)]
    provider: ProviderKind,
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
    /// Where the state lives: `sqlite` (knit.db in the state directory),
    /// `sqlite:PATH`, or a PostgreSQL URL (postgres://user@host:port/db)
    /// shared by several servers, of which one leads (docs/ha.md). Give
    /// the password in a file rather than in the URL: `?passfile=PATH`
    /// (libpq's format, mode 0600).
    #[arg(long, env = "KNIT_DATASTORE", default_value = "sqlite")]
    datastore: String,
    /// The key file that seals the secrets servers share in a PostgreSQL
    /// datastore (the API's CA key, the admin token): 32 random bytes in
    /// base64 (`openssl rand -base64 32`), mode 0600, the same file for
    /// every server of the datastore; needed with a postgres:// datastore,
    /// unused with SQLite (docs/security.md).
    #[arg(long, env = "KNIT_SECRETS_KEY_FILE")]
    secrets_key_file: Option<PathBuf>,
    /// Seconds the leader lease lasts without renewal (several servers).
    #[arg(long, default_value_t = 8)]
    lease_ttl: u64,
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
    /// The web console (TLS, under /ui/): ADDRESS:PORT, or `off`. Default
    /// 127.0.0.1:7444, skipped with a warning when another server holds it.
    #[arg(long, env = "KNIT_CONSOLE_LISTEN")]
    console_listen: Option<String>,
    /// How long a console sign-in lasts, in seconds.
    #[arg(long, env = "KNIT_CONSOLE_SESSION_TTL", default_value_t = 8 * 3600)]
    console_session_ttl: u64,
    /// cluster-autoscaler's externalgrpc cloud provider service (gRPC,
    /// mutual TLS; docs/autoscaling.md): ADDRESS:PORT, or `off`. Default
    /// 127.0.0.1:7445, skipped with a warning when another server holds it.
    #[arg(long, env = "KNIT_AUTOSCALER_LISTEN")]
    autoscaler_listen: Option<String>,
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
    /// The log's format on stderr: `text` (coloured only on a terminal)
    /// or `json` (one object a line, for a log collector).
    #[arg(long, env = "KNIT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// A drain stops waiting for a pod being deleted on a node that is not
    /// Ready (its kubelet cannot confirm) this many seconds after the
    /// deletion was due, as Cluster API does for unreachable nodes.
    #[arg(long, env = "KNIT_DRAIN_SKIP_WAIT_SECONDS", default_value_t = 60)]
    drain_skip_wait_seconds: u64,
    /// Connections open at once on the API (all its listen addresses
    /// together); one more is closed at once (docs/security.md).
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Connections open at once from one client address, on each listener
    /// (API, console, embedded Kubernetes API, autoscaler service). Behind
    /// a proxy every client is the proxy's address: raise it there.
    #[arg(long, default_value_t = 128)]
    max_connections_per_address: usize,
    /// Connections open at once on the web console.
    #[arg(long, default_value_t = 256)]
    console_max_connections: usize,
    /// Connections open at once on the embedded Kubernetes API (each node
    /// keeps one or two).
    #[arg(long, default_value_t = 4096)]
    cluster_max_connections: usize,
    /// Connections open at once on the autoscaler service.
    #[arg(long, default_value_t = 64)]
    autoscaler_max_connections: usize,
    /// Seconds an HTTP/1.1 request head may take (from a connection's start
    /// or its last request's end) before the connection is closed.
    #[arg(long, default_value_t = 10)]
    header_timeout: u64,
    /// HTTP/2 streams (requests) open at once on one connection.
    #[arg(long, default_value_t = 250)]
    http2_max_streams: u32,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// A line for whoever started the server: plain on stderr, or a log
/// record when the log is JSON (so every line of it parses).
fn announce(format: LogFormat, line: &str) {
    match format {
        LogFormat::Text => eprintln!("{line}"),
        LogFormat::Json => tracing::info!("{line}"),
    }
}

/// How `knit up` starts `knit server`: its arguments, and what goes in its
/// environment instead (a datastore URL holding a password: never in a
/// process's argv, which every user of the machine can read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCommandLine {
    pub args: Vec<std::ffi::OsString>,
    pub env: Vec<(&'static str, String)>,
}

impl ServerOpts {
    /// The `knit server` command line that gives a server exactly these
    /// options. Every field is named here (a new option that is not passed
    /// does not compile), and `every_server_flag_given_to_up_reaches_the_server`
    /// parses the result back as `knit server` would.
    pub fn server_command_line(&self) -> ServerCommandLine {
        let ServerOpts {
            state_dir,
            listen,
            advertise_address,
            provider,
            region,
            ecs_endpoint,
            ecs_vswitch,
            ecs_security_group,
            ecs_image,
            datastore,
            secrets_key_file,
            lease_ttl,
            parallelism,
            join_token_ttl,
            cluster,
            cluster_port,
            console_listen,
            console_session_ttl,
            autoscaler_listen,
            local_state_dir,
            local_bridge,
            local_subnet,
            local_metadata_port,
            log_format,
            drain_skip_wait_seconds,
            max_connections,
            max_connections_per_address,
            console_max_connections,
            cluster_max_connections,
            autoscaler_max_connections,
            header_timeout,
            http2_max_streams,
        } = self;
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        let mut flag = |name: &str, value: std::ffi::OsString| {
            args.push(format!("--{name}").into());
            args.push(value);
        };
        flag("state-dir", state_dir.into());
        flag("local-state-dir", local_state_dir.into());
        if let Some(key) = secrets_key_file {
            flag("secrets-key-file", key.into());
        }
        for (name, value) in [
            ("listen", listen),
            ("advertise-address", advertise_address),
            ("region", region),
            ("ecs-endpoint", ecs_endpoint),
            ("ecs-vswitch", ecs_vswitch),
            ("ecs-image", ecs_image),
            ("console-listen", console_listen),
            ("autoscaler-listen", autoscaler_listen),
        ] {
            if let Some(v) = value {
                flag(name, v.into());
            }
        }
        if !ecs_security_group.is_empty() {
            flag("ecs-security-group", ecs_security_group.join(",").into());
        }
        for (name, value) in [
            ("provider", provider.as_str().to_string()),
            ("lease-ttl", lease_ttl.to_string()),
            ("parallelism", parallelism.to_string()),
            ("join-token-ttl", join_token_ttl.to_string()),
            ("cluster", cluster.clone()),
            ("cluster-port", cluster_port.to_string()),
            ("console-session-ttl", console_session_ttl.to_string()),
            ("local-bridge", local_bridge.clone()),
            ("local-subnet", local_subnet.clone()),
            ("local-metadata-port", local_metadata_port.to_string()),
            (
                "drain-skip-wait-seconds",
                drain_skip_wait_seconds.to_string(),
            ),
            ("max-connections", max_connections.to_string()),
            (
                "max-connections-per-address",
                max_connections_per_address.to_string(),
            ),
            (
                "console-max-connections",
                console_max_connections.to_string(),
            ),
            (
                "cluster-max-connections",
                cluster_max_connections.to_string(),
            ),
            (
                "autoscaler-max-connections",
                autoscaler_max_connections.to_string(),
            ),
            ("header-timeout", header_timeout.to_string()),
            ("http2-max-streams", http2_max_streams.to_string()),
            (
                "log-format",
                match log_format {
                    LogFormat::Text => "text",
                    LogFormat::Json => "json",
                }
                .to_string(),
            ),
        ] {
            flag(name, value.into());
        }
        let mut env = Vec::new();
        if has_password(datastore) {
            env.push(("KNIT_DATASTORE", datastore.clone()));
        } else {
            flag("datastore", datastore.into());
        }
        ServerCommandLine { args, env }
    }
}

/// Whether a datastore URL carries a password (`scheme://user:password@…`).
fn has_password(datastore: &str) -> bool {
    datastore
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next())
        .and_then(|authority| authority.rsplit_once('@'))
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

/// `--provider`'s parser: its words are [`ProviderKind`]'s (listed in
/// `--help` and completions), parsed once here.
#[derive(Clone)]
struct ProviderKindParser;

impl clap::builder::TypedValueParser for ProviderKindParser {
    type Value = ProviderKind;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> std::result::Result<ProviderKind, clap::Error> {
        value.to_string_lossy().parse().map_err(|rule: String| {
            clap::Error::raw(clap::error::ErrorKind::InvalidValue, rule + "\n")
        })
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(
            ProviderKind::ALL
                .into_iter()
                .map(|k| clap::builder::PossibleValue::new(k.as_str())),
        ))
    }
}

/// The optional parts of knit (cargo features) these options ask for, each
/// with how the user asked for it.
fn needed_features(opts: &ServerOpts) -> Vec<(Feature, String)> {
    let mut needed = Vec::new();
    if let Some(f) = opts.provider.feature() {
        needed.push((f, format!("--provider {}", opts.provider)));
    }
    if let Some(f) = features::for_datastore(&opts.datastore) {
        needed.push((f, "--datastore postgres://…".to_string()));
    }
    needed
}

/// Refuses options that need a part this binary was built without
/// (scripts/up.sh's build leaves out ECS, QEMU and PostgreSQL), naming the
/// cargo feature and the command that builds it.
fn check_features(opts: &ServerOpts) -> std::result::Result<(), features::FeatureMissing> {
    for (feature, asked) in needed_features(opts) {
        features::require(feature, &asked)?;
    }
    Ok(())
}

/// The ECS settings from the server's flags, refused (naming every flag
/// still to give) when one ECS needs is missing.
#[cfg(feature = "ecs")]
fn ecs_settings(opts: &ServerOpts) -> Result<knit_server::provider::ecs::EcsSettings> {
    let mut s =
        knit_server::provider::ecs::EcsSettings::new(opts.region.as_deref().unwrap_or_default());
    s.endpoint = opts.ecs_endpoint.clone();
    s.v_switch_id = opts.ecs_vswitch.clone();
    s.security_group_ids = opts.ecs_security_group.clone();
    s.default_image = opts.ecs_image.clone();
    let missing = s.missing_required();
    if !missing.is_empty() {
        return Err(CliError::Usage(format!(
            "--provider ecs needs {}",
            missing.join("; ")
        )));
    }
    Ok(s)
}

/// The ECS provider from the server's flags; the key from the environment
/// or a credentials file (knit-ecs refuses one others can read). What ECS
/// needs before any instance can be made is checked here, at start: a
/// missing setting stops the server naming the flag that gives it (every
/// create would otherwise fail in the log, one after another).
#[cfg(feature = "ecs")]
fn ecs_provider(opts: &ServerOpts) -> Result<knit_server::provider::ecs::EcsProvider> {
    let s = ecs_settings(opts)?;
    let credentials =
        knit_ecs::Credentials::discover().map_err(|e| CliError::Failed(e.to_string()))?;
    Ok(knit_server::provider::ecs::EcsProvider::new(
        s,
        credentials,
    )?)
}

/// What `--provider qemu` runs on this host: (program, Debian package).
#[cfg(feature = "qemu")]
const QEMU_PROGRAMS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("qemu-img", "qemu-utils"),
    ("mkfs.vfat", "dosfstools"),
    ("mcopy", "mtools"),
];

/// `--provider qemu` refused at start when a program it runs is missing,
/// naming the packages and the command that installs them (the main job's
/// setup leaves QEMU out).
#[cfg(feature = "qemu")]
fn check_qemu_programs() -> Result<()> {
    let missing: Vec<(&str, &str)> = QEMU_PROGRAMS
        .iter()
        .copied()
        .filter(|(program, _)| {
            package::which(program).is_none()
                && !["/usr/sbin", "/sbin"]
                    .iter()
                    .any(|d| Path::new(d).join(program).is_file())
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let programs: Vec<&str> = missing.iter().map(|(p, _)| *p).collect();
    let mut packages: Vec<&str> = missing.iter().map(|(_, p)| *p).collect();
    packages.dedup();
    Err(CliError::Usage(format!(
        "--provider qemu runs {} (not installed): install them with `sudo scripts/setup.sh --qemu` \
         (or apt-get install {})",
        programs.join(", "),
        packages.join(" ")
    )))
}

/// The provider's gateway: where its instances reach this host.
fn gateway(opts: &ServerOpts) -> Result<Option<std::net::IpAddr>> {
    if !opts.provider.on_local_bridge() {
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
    s.console = console_settings(opts)?;
    s.autoscaler = autoscaler_settings(opts)?;
    s.datastore = knit_db::Datastore::parse(&opts.datastore, &s.db_path())
        .map_err(|e| CliError::Usage(format!("--datastore: {e}")))?;
    s.secrets_key_file = opts.secrets_key_file.clone();
    if opts.lease_ttl < 3 {
        return Err(CliError::Usage(format!(
            "--lease-ttl {}: must be at least 3 seconds (the lease is renewed every third of it)",
            opts.lease_ttl
        )));
    }
    s.lease_ttl = Duration::from_secs(opts.lease_ttl);
    s.drain_skip_wait = Duration::from_secs(opts.drain_skip_wait_seconds);
    for (flag, value) in [
        ("--max-connections", opts.max_connections),
        (
            "--max-connections-per-address",
            opts.max_connections_per_address,
        ),
        ("--console-max-connections", opts.console_max_connections),
        ("--cluster-max-connections", opts.cluster_max_connections),
        (
            "--autoscaler-max-connections",
            opts.autoscaler_max_connections,
        ),
        ("--header-timeout", opts.header_timeout as usize),
        ("--http2-max-streams", opts.http2_max_streams as usize),
    ] {
        if value == 0 {
            return Err(CliError::Usage(format!("{flag} 0: must be at least 1")));
        }
    }
    s.limits.max_connections = opts.max_connections;
    s.limits.max_per_address = opts.max_connections_per_address;
    s.limits.console_max_connections = opts.console_max_connections;
    s.limits.autoscaler_max_connections = opts.autoscaler_max_connections;
    s.limits.header_timeout = Duration::from_secs(opts.header_timeout);
    s.limits.http2_max_streams = opts.http2_max_streams;
    Ok(s)
}

/// `--console-listen`: an address, `off`, or (absent) the default port on
/// loopback, which another server may already hold.
fn console_settings(opts: &ServerOpts) -> Result<Option<knit_server::ConsoleSettings>> {
    use knit_server::{ConsoleSettings, DEFAULT_CONSOLE_PORT};
    let (listen, required) = match opts.console_listen.as_deref().map(str::trim) {
        Some("off") => return Ok(None),
        Some(text) => (
            text.parse().map_err(|_| {
                CliError::Usage(format!(
                    "--console-listen {text:?}: must be ADDRESS:PORT or off"
                ))
            })?,
            true,
        ),
        None => (
            std::net::SocketAddr::from(([127, 0, 0, 1], DEFAULT_CONSOLE_PORT)),
            false,
        ),
    };
    let mut console = ConsoleSettings::new(listen);
    console.session_ttl = Duration::from_secs(opts.console_session_ttl.max(1));
    console.required = required;
    Ok(Some(console))
}

/// `--autoscaler-listen`: an address, `off`, or (absent) the default port
/// on loopback, which another server may already hold.
fn autoscaler_settings(
    opts: &ServerOpts,
) -> Result<Option<knit_server::autoscaler::AutoscalerSettings>> {
    use knit_server::autoscaler::{AutoscalerSettings, DEFAULT_PORT};
    match opts.autoscaler_listen.as_deref().map(str::trim) {
        Some("off") => Ok(None),
        Some(text) => Ok(Some(AutoscalerSettings {
            listen: text.parse().map_err(|_| {
                CliError::Usage(format!(
                    "--autoscaler-listen {text:?}: must be ADDRESS:PORT or off"
                ))
            })?,
            required: true,
        })),
        None => Ok(Some(AutoscalerSettings {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            required: false,
        })),
    }
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

pub fn init(cli_config: &Option<PathBuf>, opts: &ServerOpts) -> Result<ExitCode> {
    let s = settings(opts)?;
    std::fs::create_dir_all(&s.state_dir)
        .map_err(io(format!("create {}", s.state_dir.display())))?;
    let (ca_cert, token) = knit_server::init_state(&s)?;
    let path = config_path(cli_config)?;
    ClientConfig {
        server: local_url(opts)?,
        token,
        ca_cert,
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

pub fn serve(
    cli_config: &Option<PathBuf>,
    opts: ServerOpts,
    write_config: bool,
) -> Result<ExitCode> {
    check_features(&opts)?;
    #[allow(unused_mut)] // without ECS there is no directive to add
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // ureq prints request headers at debug: an STS token is one.
    #[cfg(feature = "ecs")]
    {
        filter = filter.add_directive(
            knit_ecs::LOG_DIRECTIVE
                .parse()
                .map_err(|e| CliError::Failed(format!("log filter: {e}")))?,
        );
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match opts.log_format {
        LogFormat::Json => logs.json().init(),
        // Colour codes only for a person at a terminal, never in a file.
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    let mut s = settings(&opts)?;
    // Every listener's connections must fit under the open-file limit
    // (raised to the hard limit here), the embedded API's with the rest.
    let mut cluster_max = opts.cluster_max_connections;
    {
        let limits = &mut s.limits;
        let mut fit: Vec<(&str, &mut usize)> = vec![("api", &mut limits.max_connections)];
        if s.console.is_some() {
            fit.push(("console", &mut limits.console_max_connections));
        }
        if s.autoscaler.is_some() {
            fit.push(("autoscaler", &mut limits.autoscaler_max_connections));
        }
        if opts.cluster == "embedded" {
            fit.push(("kube-api", &mut cluster_max));
        }
        knit_cluster::conn::fit_descriptors(&mut fit)
            .map_err(io("read the open-file limit (RLIMIT_NOFILE)"))?;
    }
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
    let provider: Option<Arc<dyn knit_server::provider::Provider>> = match opts.provider {
        ProviderKind::Local => Some(Arc::new(knit_server::provider::local::LocalProvider::new(
            local_config(&opts),
        )?)),
        #[cfg(feature = "ecs")]
        ProviderKind::Ecs => Some(Arc::new(ecs_provider(&opts)?)),
        #[cfg(feature = "qemu")]
        ProviderKind::Qemu => {
            check_qemu_programs()?;
            Some(clouds::qemu_provider(local_config(&opts))?)
        }
        _ => None,
    };
    let runtime = tokio::runtime::Runtime::new().map_err(io("start the async runtime"))?;
    runtime.block_on(async move {
        let embedded = match opts.cluster.as_str() {
            "embedded" => Some(Arc::new(start_cluster(&s, &opts, cluster_max).await?)),
            _ => None,
        };
        let join: Arc<dyn knit_server::ClusterJoin> = match &embedded {
            Some(e) => e.clone(),
            None => Arc::new(knit_server::NoCluster),
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
        announce(
            opts.log_format,
            &format!(
                "knit server on {} (instances use {})",
                server.local_url,
                server.control.advertise_url()
            ),
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(io("install SIGTERM handler"))?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        announce(opts.log_format, "knit server stopping");
        server.shutdown().await;
        if let Some(e) = embedded {
            e.stop();
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn local_config(opts: &ServerOpts) -> knit_local::Config {
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
    max_connections: usize,
) -> Result<knit_server::EmbeddedJoin> {
    let gateway = gateway(opts)?;
    let listen = cluster_listen(s, gateway, opts.cluster_port);
    let addrs = [listen];
    let advertise = knit_server::advertise_host(s, &addrs, gateway);
    let mut cfg = knit_cluster::ClusterConfig::new(s.state_dir.join("cluster"), listen);
    cfg.advertise_address = Some(advertise);
    cfg.connections = knit_cluster::conn::ListenerLimits {
        max_connections,
        max_per_address: s.limits.max_per_address,
    };
    cfg.http = s.limits.http();
    // Node podCIDRs are cut from the Cluster's `spec.network.podCidr` (the
    // stored document, read at start; the default before one is applied).
    if let Some(stored) = knit_server::stored_cluster(s)? {
        cfg.pod_cidr = stored.spec.network.pod_cidr;
    }
    // On a shared datastore the embedded API's objects live there too, so
    // that every server serves the same nodes (SQLite: its own cluster.db).
    cfg.datastore = s.datastore.is_shared().then(|| s.datastore.clone());
    let cluster = knit_cluster::EmbeddedCluster::start(cfg)
        .await
        .map_err(|e| CliError::Failed(format!("embedded cluster on {listen}: {e}")))?;
    announce(
        opts.log_format,
        &format!(
            "embedded Kubernetes API at {} (admin kubeconfig {})",
            cluster.endpoint(),
            cluster.admin_kubeconfig_path().display()
        ),
    );
    Ok(knit_server::EmbeddedJoin::new(cluster, s.join_token_ttl)?)
}

pub fn up(cli_config: &Option<PathBuf>, opts: ServerOpts) -> Result<ExitCode> {
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
    // The server would refuse to start: say so before starting it.
    check_features(&opts)?;
    match opts.provider {
        #[cfg(feature = "ecs")]
        ProviderKind::Ecs => drop(ecs_settings(&opts)?),
        #[cfg(feature = "qemu")]
        ProviderKind::Qemu => check_qemu_programs()?,
        _ => {}
    }
    std::fs::create_dir_all(&opts.state_dir)
        .map_err(io(format!("create {}", opts.state_dir.display())))?;
    // Before the server runs: `knit down` removes the clouds it made.
    clouds::record(&opts.state_dir, opts.provider, &local_config(&opts))?;
    ensure_mirror(&opts)?;
    let log_path = opts.state_dir.join("server.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io(format!("open {}", log_path.display())))?;
    let log2 = log.try_clone().map_err(io("dup log"))?;
    let exe = std::env::current_exe().map_err(io("find the knit executable"))?;
    let line = opts.server_command_line();
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("server")
        .args(&line.args)
        .envs(line.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2);
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
                if c.healthy() {
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

/// Embedded defaults: a server without a package mirror could make no
/// node, so the first `up` assembles one from this machine in
/// `<state>/mirror` (with `--ha`, every server serves this one).
fn ensure_mirror(opts: &ServerOpts) -> Result<()> {
    let mirror = Settings::new(opts.state_dir.clone()).mirror_dir();
    if !mirror.join("bin/knit-agent").is_file() {
        let no_runtime = package::which("containerd").is_none();
        println!(
            "assembling the package mirror in {}{}",
            mirror.display(),
            if no_runtime {
                " (containerd is not installed: package without a runtime)"
            } else {
                ""
            }
        );
        package::run(package::PackageAction::Build {
            state_dir: opts.state_dir.clone(),
            kubernetes_version: knit_api::DEFAULT_KUBERNETES_VERSION.to_string(),
            agent: None,
            kubelet: None,
            no_runtime,
        })?;
    }
    Ok(())
}

/// True when `pid` runs `knit server` (so a recycled PID is never signalled).
fn is_our_server(pid: u32) -> bool {
    knit_os::proc::cmdline(pid as i32).is_some_and(|args| {
        args.first().is_some_and(|a| a.ends_with(b"knit"))
            && args.get(1).is_some_and(|a| a == b"server")
    })
}

pub fn down(
    cli_config: &Option<PathBuf>,
    keep_instances: bool,
    keep_cloud: bool,
    timeout: Duration,
) -> Result<ExitCode> {
    let path = config_path(cli_config)?;
    let mut config = ClientConfig::load(&path)?;
    // `knit up --ha` ran here: its servers, HAProxy and PostgreSQL.
    let ha_dir = config
        .state_dir
        .as_deref()
        .map(Path::new)
        .filter(|d| ha::present(d));
    // A server `knit up` started that has died (killed, host reboot) cannot
    // delete its pools, nor say which instances were added by attach: stop
    // before anything is removed and say how to go on.
    let dead = match ha_dir {
        Some(d) => (!ha::any_server_running(d))
            .then(|| "no knit server of `knit up --ha` is running".to_string()),
        None => config
            .pid
            .filter(|pid| !is_our_server(*pid))
            .map(|pid| format!("knit server (pid {pid}) is not running")),
    };
    if let Some(what) = dead {
        if !keep_instances {
            return Err(CliError::Failed(format!(
                "{what}, so its pools were not deleted and nothing was removed \
                 (the local cloud may hold instances added by attach, which knit never releases). \
                 Start it again with `knit up` and rerun `knit down`, or keep the instances with `knit down --keep-instances`, \
                 or remove the local cloud and every instance in it with `knit local down`"
            )));
        }
    }
    // Instances added by attach that the pools' deletion kept (docs/spec.md §2.4).
    let mut added_kept: Vec<String> = Vec::new();
    if !keep_instances {
        let c = Client::new(&config)?;
        for p in c.list_pools()? {
            let name = p.view.metadata.name;
            c.delete_pool(&name)?;
            println!("nodepool/{name} deleted");
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let instances: Vec<_> = c.list_instances()?.into_iter().map(|i| i.view).collect();
            let left: Vec<String> = instances
                .iter()
                .filter(|i| i.state != InstanceState::Detached)
                .map(|i| i.name.clone())
                .collect();
            if left.is_empty() {
                added_kept = instances
                    .iter()
                    .filter(|i| i.added)
                    .map(|i| crate::output::opt(&i.provider_id))
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
    match (ha_dir, config.pid) {
        (Some(dir), _) => ha::stop(dir)?,
        (None, Some(pid)) if is_our_server(pid) => {
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
        (None, Some(pid)) => println!("knit server (pid {pid}) is not running"),
        (None, None) => {
            println!("this config has no server started by `knit up`; nothing to stop")
        }
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
            clouds::down(Path::new(dir))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// Every option of `knit server`, each with a value that is not its default.
    const GIVEN: &[(&str, &str)] = &[
        ("--state-dir", "/srv/knit-test/state"),
        ("--listen", "127.0.0.1:17001,10.9.0.1:17001"),
        ("--advertise-address", "10.9.0.1"),
        ("--provider", "ecs"),
        ("--region", "cn-shanghai"),
        ("--ecs-endpoint", "https://127.0.0.1:19999"),
        ("--ecs-vswitch", "vsw-test0001"),
        ("--ecs-security-group", "sg-test0001,sg-test0002"),
        ("--ecs-image", "m-test0001"),
        ("--datastore", "postgres://knit@127.0.0.1:15999/knit"),
        ("--secrets-key-file", "/srv/knit-test/secrets.key"),
        ("--lease-ttl", "11"),
        ("--parallelism", "7"),
        ("--join-token-ttl", "901"),
        ("--cluster", "none"),
        ("--cluster-port", "16999"),
        ("--console-listen", "127.0.0.1:17999"),
        ("--console-session-ttl", "999"),
        ("--autoscaler-listen", "127.0.0.1:17998"),
        ("--local-state-dir", "/srv/knit-test/local"),
        ("--local-bridge", "kntest0"),
        ("--local-subnet", "10.9.0.0/24"),
        ("--local-metadata-port", "8099"),
        ("--log-format", "json"),
        ("--drain-skip-wait-seconds", "7"),
        ("--max-connections", "2000"),
        ("--max-connections-per-address", "300"),
        ("--console-max-connections", "64"),
        ("--cluster-max-connections", "9000"),
        ("--autoscaler-max-connections", "8"),
        ("--header-timeout", "20"),
        ("--http2-max-streams", "100"),
    ];

    fn up(args: &[&str]) -> ServerOpts {
        let argv = ["knit", "up"].iter().chain(args).copied();
        match crate::Cli::try_parse_from(argv).unwrap().cmd {
            crate::Cmd::Up(up) => up.opts,
            _ => panic!("not knit up"),
        }
    }

    /// What `knit server` parses from the command line `knit up` starts it with.
    fn server_started_by(opts: &ServerOpts) -> ServerOpts {
        let line = opts.server_command_line();
        assert!(line.env.is_empty(), "{:?}", line.env);
        let argv = ["knit", "server"]
            .map(std::ffi::OsString::from)
            .into_iter()
            .chain(line.args);
        match crate::Cli::try_parse_from(argv).unwrap().cmd {
            crate::Cmd::Server {
                action: None, opts, ..
            } => opts,
            _ => panic!("not knit server"),
        }
    }

    #[test]
    fn every_server_flag_given_to_up_reaches_the_server() {
        // The test names every option (one added later must be added here).
        let cmd = <ServerOpts as clap::Args>::augment_args(clap::Command::new("server"));
        for arg in cmd.get_arguments() {
            let long = format!("--{}", arg.get_long().unwrap_or_default());
            assert!(
                GIVEN.iter().any(|(flag, _)| *flag == long),
                "{long} is not given by this test"
            );
        }
        let defaults = up(&[]);
        assert_eq!(server_started_by(&defaults), defaults);
        // Each flag alone changes the options, and the server gets them.
        for (flag, value) in GIVEN {
            let opts = up(&[flag, value]);
            assert_ne!(opts, defaults, "{flag} {value} changed nothing");
            assert_eq!(server_started_by(&opts), opts, "{flag} {value}");
        }
        // All at once.
        let all: Vec<&str> = GIVEN.iter().flat_map(|(f, v)| [*f, *v]).collect();
        let opts = up(&all);
        assert_eq!(server_started_by(&opts), opts);
        assert_eq!(opts.region.as_deref(), Some("cn-shanghai"));
        assert_eq!(opts.ecs_security_group, ["sg-test0001", "sg-test0002"]);
    }

    #[test]
    fn a_datastore_password_goes_in_the_environment_not_argv() {
        let opts = up(&["--datastore", "postgres://knit:s3cret@127.0.0.1:15999/knit"]);
        let line = opts.server_command_line();
        assert!(line
            .args
            .iter()
            .all(|a| !a.to_string_lossy().contains("s3cret")));
        assert_eq!(
            line.env,
            [(
                "KNIT_DATASTORE",
                "postgres://knit:s3cret@127.0.0.1:15999/knit".to_string()
            )]
        );
        assert!(!has_password("postgres://knit@h:5432/db?sslmode=require"));
        assert!(!has_password("sqlite:/var/lib/knit/x.db"));
        assert!(has_password("postgresql://u:p@h/db"));
    }

    /// The provider and datastore asked for map to the features they need;
    /// each is refused, naming the feature and the command that builds it,
    /// when the binary lacks it (`check` with "not built in": the test
    /// build has every feature).
    #[test]
    fn options_needing_a_feature_name_it_and_are_refused_without_it() {
        let asked = needed_features(&up(&[
            "--provider",
            "qemu",
            "--datastore",
            "postgres://knit@127.0.0.1:5432/knit",
        ]));
        assert_eq!(
            asked,
            [
                (Feature::Qemu, "--provider qemu".to_string()),
                (Feature::Postgres, "--datastore postgres://…".to_string())
            ]
        );
        assert_eq!(
            needed_features(&up(&["--provider", "ecs"])),
            [(Feature::Ecs, "--provider ecs".to_string())]
        );
        assert!(needed_features(&up(&[])).is_empty(), "local on SQLite");
        for (feature, how) in asked {
            let e = CliError::from(features::check(feature, false, &how).unwrap_err());
            assert_eq!(e.code(), "FeatureMissing");
            let text = e.to_string();
            let command = format!(
                "`cargo build --release --locked -p knit-cli --no-default-features --features {}`",
                feature.name()
            );
            assert!(text.starts_with(&how), "{text}");
            assert!(text.contains(&command), "{text}");
            assert!(features::check(feature, true, &how).is_ok());
        }
        assert_eq!(
            check_features(&up(&["--provider", "qemu"])).is_ok(),
            Feature::Qemu.built_in()
        );
    }

    #[cfg(feature = "ecs")]
    #[test]
    fn ecs_settings_missing_at_start_name_their_flags() {
        let Err(e) = ecs_settings(&up(&["--provider", "ecs", "--region", "cn-shanghai"])) else {
            panic!("ECS without vSwitch, security group and image was accepted");
        };
        let text = e.to_string();
        for flag in ["--ecs-vswitch", "--ecs-security-group", "--ecs-image"] {
            assert!(text.contains(flag), "{flag} not named: {text}");
        }
        assert!(!text.contains("--region"), "{text}");
        let all: Vec<&str> = GIVEN.iter().flat_map(|(f, v)| [*f, *v]).collect();
        assert!(ecs_settings(&up(&all)).is_ok());
    }
}
