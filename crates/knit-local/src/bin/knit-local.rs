//! `knit-local`: the local cloud's CLI (the verbs `knit local …` wraps), and
//! the hidden helpers it runs as PID 1 of an instance and as the metadata server.

use clap::{Parser, Subcommand};
use knit_local::{Cloud, Config, DiskInterface, DiskSpec, LocalError, Quantity, Template};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "knit-local",
    about = "knit's local cloud: sandbox machines on this host"
)]
struct Cli {
    #[arg(
        long,
        env = "KNIT_LOCAL_STATE_DIR",
        default_value = "/var/lib/knit/local",
        global = true
    )]
    state_dir: PathBuf,
    #[arg(
        long,
        env = "KNIT_LOCAL_BRIDGE",
        default_value = "knit0",
        global = true
    )]
    bridge: String,
    #[arg(
        long,
        env = "KNIT_LOCAL_SUBNET",
        default_value = "10.213.0.0/24",
        global = true
    )]
    subnet: String,
    #[arg(
        long,
        env = "KNIT_LOCAL_METADATA_PORT",
        default_value_t = 80,
        global = true
    )]
    metadata_port: u16,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create and boot an instance from a template (YAML/JSON file, `-` for stdin).
    Create {
        #[arg(short = 'f', long)]
        file: PathBuf,
    },
    Start {
        id: String,
    },
    Stop {
        id: String,
    },
    Reboot {
        id: String,
    },
    /// New system layer from the base root; data disks kept with new ids.
    Reimage {
        id: String,
        /// File with the new user data.
        #[arg(long)]
        user_data: Option<PathBuf>,
        /// Another image: an image directory (or `/`, the host's root) as
        /// the new base root; default the instance's current one.
        #[arg(long)]
        base_root: Option<PathBuf>,
    },
    /// Rename an instance (name attribute and hostname; a running instance's
    /// hostname changes at once).
    Rename {
        id: String,
        name: String,
    },
    /// Set root's password inside a running instance; the password is read
    /// from stdin (first line), never from the command line.
    SetPassword {
        id: String,
    },
    Delete {
        id: String,
    },
    List,
    Describe {
        id: String,
    },
    /// How many instances of a type this cloud may hold at once, as a
    /// cloud's zone runs out of a type: `capacity TYPE N` sets it, `capacity
    /// TYPE none` lifts it, `capacity` prints them. A create past it is
    /// refused (LocalOutOfCapacity), and knit tries a pool's next type.
    Capacity {
        instance_type: Option<String>,
        /// A count, or `none` for no limit.
        count: Option<String>,
    },
    /// Run a command inside a running instance.
    Exec {
        id: String,
        #[arg(trailing_var_arg = true, required = true)]
        argv: Vec<String>,
    },
    /// Print the user-data runner's result record (waits up to --timeout seconds).
    UserDataResult {
        id: String,
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Shape (or with no --mbit, unshape) a running instance's link.
    Shape {
        id: String,
        #[arg(long)]
        mbit: Option<u32>,
    },
    #[command(subcommand)]
    Disk(DiskCmd),
    #[command(subcommand)]
    Snapshot(SnapCmd),
    /// Make the network (bridge with the gateway address, metadata server)
    /// now, before any instance: host services can then listen on the
    /// bridge address alone.
    NetworkUp,
    /// Remove every leftover of this state directory: processes, loop devices, veths, namespaces, bridge, state.
    Down,
    /// Build the node OS image (what `knit image build` does): mmdebstrap
    /// from the host's apt sources into DIR/<key>; nothing when built.
    #[command(name = "image-build")]
    ImageBuild {
        #[arg(long, env = knit_local::image::DIR_ENV, default_value = knit_local::image::DEFAULT_DIR)]
        out: PathBuf,
    },
    #[command(name = "__boot", hide = true)]
    Boot {
        spec: PathBuf,
    },
    #[command(name = "__metadata", hide = true)]
    Metadata {
        #[arg(long)]
        listen: std::net::SocketAddr,
    },
}

#[derive(Subcommand)]
enum DiskCmd {
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        size: Option<String>,
        #[arg(long, value_parser = ["virtio", "nvme"], default_value = "virtio")]
        interface: String,
        #[arg(long)]
        snapshot: Option<String>,
        #[arg(long)]
        format: Option<String>,
    },
    List,
    Delete {
        id: String,
    },
    Attach {
        disk: String,
        instance: String,
    },
    Detach {
        disk: String,
    },
}

#[derive(Subcommand)]
enum SnapCmd {
    Create {
        disk: String,
        /// A name recorded with the snapshot (before the clone starts).
        #[arg(long)]
        name: Option<String>,
    },
    List,
    Delete {
        id: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Boot { spec } => return ExitCode::from(knit_local::boot::shim_main(&spec) as u8),
        Cmd::Metadata { listen } => {
            return match knit_local::metadata::serve(cli.state_dir.clone(), listen) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("knit-local metadata: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Cmd::ImageBuild { out } => {
            let built = knit_local::image::build(&out, &mut |line| eprintln!("{line}"));
            return match built.and_then(|b| print(&b.manifest)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error[{}]: {e}", e.code());
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    // Logs on stderr (warnings by default, RUST_LOG to change); results on stdout.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error[{}]: {e}", e.code());
            ExitCode::FAILURE
        }
    }
}

fn print<T: serde::Serialize>(v: &T) -> Result<(), LocalError> {
    let s = serde_json::to_string_pretty(v).map_err(|e| LocalError::Parse {
        what: "output".into(),
        message: e.to_string(),
    })?;
    println!("{s}");
    Ok(())
}

fn read_input(path: &PathBuf) -> Result<String, LocalError> {
    let mut s = String::new();
    let r = if path.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut s).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| s = t)
    };
    r.map_err(|source| LocalError::Io {
        context: "cannot read",
        path: path.clone(),
        source,
    })?;
    Ok(s)
}

fn run(cli: Cli) -> Result<(), LocalError> {
    let cloud = Cloud::open(Config {
        state_dir: cli.state_dir,
        bridge: cli.bridge,
        subnet: cli.subnet,
        metadata_port: cli.metadata_port,
        helper: None,
    })?;
    match cli.cmd {
        Cmd::Create { file } => print(&cloud.create(&Template::parse(&read_input(&file)?)?)?),
        Cmd::Start { id } => print(&cloud.start(&id)?),
        Cmd::Stop { id } => print(&cloud.stop(&id)?),
        Cmd::Reboot { id } => print(&cloud.reboot(&id)?),
        Cmd::Reimage {
            id,
            user_data,
            base_root,
        } => {
            let ud = user_data.map(|p| read_input(&p)).transpose()?;
            print(&cloud.reimage_from(&id, ud, base_root.as_deref())?)
        }
        Cmd::Rename { id, name } => print(&cloud.rename(&id, &name)?),
        Cmd::SetPassword { id } => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|source| LocalError::Io {
                    context: "cannot read the password from",
                    path: "stdin".into(),
                    source,
                })?;
            let password = line.strip_suffix('\n').unwrap_or(&line);
            let password = password.strip_suffix('\r').unwrap_or(password);
            print(&cloud.set_password(&id, password)?)
        }
        Cmd::Delete { id } => cloud.delete(&id),
        Cmd::Capacity {
            instance_type,
            count,
        } => match (instance_type, count) {
            (Some(t), Some(n)) => {
                let capacity = match n.as_str() {
                    "none" => None,
                    n => Some(n.parse::<u64>().map_err(|_| LocalError::Parse {
                        what: "capacity".to_string(),
                        message: format!("{n:?} is not a count or none"),
                    })?),
                };
                cloud.set_capacity(&t, capacity)
            }
            (None, None) => print(&cloud.capacity()?),
            _ => Err(LocalError::Parse {
                what: "capacity".to_string(),
                message: "give TYPE and a count (or none), or nothing to print them".to_string(),
            }),
        },
        Cmd::List => {
            for i in cloud.list()? {
                let r = &i.record;
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    r.id,
                    r.hostname,
                    if i.alive { "running" } else { "stopped" },
                    r.private_ip,
                    r.template.instance_type
                );
            }
            Ok(())
        }
        Cmd::Describe { id } => print(&cloud.describe(&id)?),
        Cmd::Exec { id, argv } => {
            let status =
                cloud
                    .exec_command(&id, &argv)?
                    .status()
                    .map_err(|source| LocalError::Io {
                        context: "cannot run",
                        path: "nsenter".into(),
                        source,
                    })?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Cmd::UserDataResult { id, timeout } => {
            print(&cloud.wait_user_data(&id, std::time::Duration::from_secs(timeout))?)
        }
        Cmd::Shape { id, mbit } => cloud.set_bandwidth(&id, mbit),
        Cmd::Disk(d) => match d {
            DiskCmd::Create {
                name,
                size,
                interface,
                snapshot,
                format,
            } => print(&cloud.disk_create(&DiskSpec {
                name,
                size: size.map(Quantity::Text),
                interface: if interface == "nvme" {
                    DiskInterface::Nvme
                } else {
                    DiskInterface::Virtio
                },
                snapshot,
                format,
            })?),
            DiskCmd::List => print(&cloud.disks()?),
            DiskCmd::Delete { id } => cloud.disk_delete(&id),
            DiskCmd::Attach { disk, instance } => print(&cloud.disk_attach(&disk, &instance)?),
            DiskCmd::Detach { disk } => print(&cloud.disk_detach(&disk)?),
        },
        Cmd::Snapshot(s) => match s {
            SnapCmd::Create { disk, name } => {
                print(&cloud.snapshot_create_named(&disk, name.as_deref())?)
            }
            SnapCmd::List => print(&cloud.snapshots()?),
            SnapCmd::Delete { id } => cloud.snapshot_delete(&id),
        },
        Cmd::NetworkUp => print(&cloud.network_up()?),
        Cmd::Down => {
            let report = cloud.down()?;
            print(&report)?;
            if report.errors.is_empty() {
                return Ok(());
            }
            Err(LocalError::Busy {
                what: "down".into(),
                message: format!(
                    "{} leftover(s) could not be released; state kept for a retry: {}",
                    report.errors.len(),
                    report.errors.join("; ")
                ),
            })
        }
        Cmd::Boot { .. } | Cmd::Metadata { .. } | Cmd::ImageBuild { .. } => Ok(()),
    }
}
