//! The local cloud (knit-local) as a [`Provider`]: real sandbox instances on
//! this host. knit-local's API is blocking (namespaces, loop devices, mounts),
//! so every call runs on tokio's blocking pool.

use crate::error::{Result, ServerError};
use crate::preflight;
use crate::provider::{
    InstanceTemplate, Provider, ProviderError, ProviderErrorKind, ProviderInstance,
    ProviderSnapshot, TypeCheck, EXEC_OUTPUT_MAX_BYTES, EXEC_TIMEOUT, READ_FILE_MAX_BYTES,
    READ_FILE_TIMEOUT, TAG_NAME, TYPE_EXAMPLES,
};
use async_trait::async_trait;
use knit_local::{Cloud, DiskInterface, DiskSpec, Instance, LocalError, Quantity, Template};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

pub struct LocalProvider {
    cloud: Arc<Cloud>,
    /// The bridge's address: the first host of the configured subnet.
    gateway: std::net::Ipv4Addr,
}

impl LocalProvider {
    pub fn new(config: knit_local::Config) -> Result<LocalProvider> {
        let gateway = local_gateway(&config.subnet)?;
        let cloud = Cloud::open(config).map_err(err)?;
        Ok(LocalProvider {
            cloud: Arc::new(cloud),
            gateway,
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Cloud) -> knit_local::Result<T> + Send + 'static,
    ) -> Result<T> {
        let cloud = self.cloud.clone();
        tokio::task::spawn_blocking(move || f(&cloud))
            .await
            .map_err(|e| ServerError::Internal(format!("local cloud task: {e}")))?
            .map_err(err)
    }
}

/// The local cloud's gateway for `subnet` (its first host address), where
/// its instances reach the host.
pub fn local_gateway(subnet: &str) -> Result<std::net::Ipv4Addr> {
    knit_local::net::Subnet::parse(subnet)
        .and_then(|s| s.host(1))
        .ok_or_else(|| {
            ProviderError::refused(
                "local",
                format!(
                    "subnet {subnet:?}: must be an IPv4 network (CIDR) holding a gateway and an instance"
                ),
            )
            .into()
        })
}

fn err(e: LocalError) -> ServerError {
    ProviderError::new(
        "local",
        kind_of(&e),
        e.code(),
        format!("{e} [{}]", e.code()),
    )
    .into()
}

/// The kind of a local cloud's error: its capacity errors (per type and
/// the host's) are `Capacity`, a machine busy or between states may pass.
pub fn kind_of(e: &LocalError) -> ProviderErrorKind {
    match e {
        LocalError::NotFound { .. } => ProviderErrorKind::NotFound,
        LocalError::OutOfCapacity { .. } | LocalError::HostOutOfCapacity { .. } => {
            ProviderErrorKind::Capacity
        }
        // Another call holds the machine, or it is stopping or starting.
        LocalError::Busy { .. } | LocalError::WrongState { .. } => ProviderErrorKind::Transient,
        // The host's own failures (a syscall, a file, a boot) may pass.
        LocalError::Io { .. } | LocalError::Sys { .. } | LocalError::Boot { .. } => {
            ProviderErrorKind::Transient
        }
        // Without root nothing here ever works.
        LocalError::NotRoot { .. } => ProviderErrorKind::Auth,
        LocalError::Parse { .. }
        | LocalError::Invalid(_)
        | LocalError::Command { .. }
        | LocalError::State { .. } => ProviderErrorKind::Permanent,
    }
}

/// The local cloud's template for a pool's instance.
pub fn local_template(t: &InstanceTemplate) -> Template {
    let mut attributes = knit_local::Attributes {
        region_id: t.region.clone(),
        vpc_id: t.vpc.clone(),
        tags: t.tags.clone(),
        ..Default::default()
    };
    if let Some(zone) = &t.zone {
        attributes.zone_id = zone.clone();
    }
    Template {
        name: Some(t.name.clone()),
        hostname: Some(t.name.clone()),
        instance_type: t.instance_type.clone(),
        base_root: base_root(&t.image),
        system_disk_size: Quantity::Text(format!("{}Gi", t.system_disk_gib)),
        disks: t
            .data_disks
            .iter()
            .enumerate()
            .map(|(i, d)| DiskSpec {
                name: format!("data{i}"),
                // A disk from a snapshot takes the snapshot's size.
                size: d
                    .snapshot_id
                    .is_none()
                    .then(|| Quantity::Text(format!("{}Gi", d.size_gib))),
                interface: if d.interface == "nvme" {
                    DiskInterface::Nvme
                } else {
                    DiskInterface::Virtio
                },
                snapshot: d.snapshot_id.clone(),
                format: None,
            })
            .collect(),
        user_data: Some(t.user_data.clone()),
        attributes,
        // knit's name is unique: a create repeated by a woken or a new
        // leader gets the instance the first one made.
        client_token: Some(t.name.clone()),
        light: t.light,
        ..Template::default()
    }
}

/// A pool's `image` as the local cloud's base root: `debian-12` is the
/// node image (`knit image build`), `debian-12-preloaded` that image with
/// the package preloaded (`knit image preload`), `host` the host's root (opt-in),
/// anything else an image directory.
fn base_root(image: &str) -> std::path::PathBuf {
    match image {
        knit_api::DEFAULT_IMAGE => knit_local::image::default_root(),
        knit_local::image::PRELOADED_NAME => knit_local::image::preloaded_root(),
        "host" => "/".into(),
        dir => dir.into(),
    }
}

/// The environment variable that lets pools use `image: host` (set to
/// `yes` in the server's environment): every node then reads the host's
/// whole root filesystem — the server's keys and tokens included.
pub const UNSAFE_HOST_IMAGE_ENV: &str = "KNIT_UNSAFE_HOST_IMAGE";

fn host_image_allowed() -> bool {
    std::env::var(UNSAFE_HOST_IMAGE_ENV).is_ok_and(|v| v == "yes")
}

/// `image: host` is refused unless the server was started saying it is
/// unsafe (issue 29).
fn check_host_image(image: &str, allowed: bool) -> Result<()> {
    if image == "host" && !allowed {
        return Err(ProviderError::refused(
            "local",
            format!(
                "image \"host\" makes the host's root filesystem (the server's keys and tokens included) every node's read-only lower layer: unsafe, refused unless the server runs with {UNSAFE_HOST_IMAGE_ENV}=yes"
            ),
        )
        .into());
    }
    Ok(())
}

/// The local cloud's answer from what it can size: the catalog
/// (`knit_api::instance_types`) and its own `local.*` types; the examples
/// are its default type and the first type of a few catalog families.
fn local_type_check(types: &[String]) -> TypeCheck {
    let unknown = types
        .iter()
        .filter(|t| knit_local::bounds::type_size(t).is_none())
        .cloned()
        .collect();
    let mut examples = vec!["local.small".to_string()];
    for t in knit_api::instance_types::all() {
        if examples.len() >= TYPE_EXAMPLES {
            break;
        }
        if !examples
            .iter()
            .any(|e| e.contains(&format!(".{}.", t.family())))
        {
            examples.push(t.name.to_string());
        }
    }
    TypeCheck { unknown, examples }
}

fn view(i: &Instance) -> ProviderInstance {
    let r = &i.record;
    let mut state = r.state.to_string();
    if state == "running" && !i.alive {
        // Recorded as running but its PID 1 is gone (host crash, kill).
        state = "dead".to_string();
    }
    ProviderInstance {
        id: r.id.clone(),
        name: r
            .template
            .attributes
            .tags
            .get(TAG_NAME)
            .cloned()
            .or_else(|| r.template.name.clone()),
        state,
        ip: Some(r.private_ip.clone()),
        tags: r.template.attributes.tags.clone(),
    }
}

/// `timeout -s KILL <s> head -c <max + 1> -- <path>`: the bounded read run
/// inside an instance.
fn bounded_read_argv(path: &str, max_bytes: usize, limit: Duration) -> Vec<String> {
    [
        "timeout",
        "-s",
        "KILL",
        &limit.as_secs().max(1).to_string(),
        "head",
        "-c",
        &(max_bytes + 1).to_string(),
        "--",
        path,
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

/// Runs a bounded read (`bounded_read_argv`, here wrapped in nsenter) and
/// returns its output: refused when more than `max_bytes` come, or when it
/// outlives `limit` (then it is killed: `kill_on_drop`).
async fn run_bounded_read(
    command: std::process::Command,
    what: &str,
    max_bytes: usize,
    limit: Duration,
) -> Result<Vec<u8>> {
    let mut command = tokio::process::Command::from(command);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| ServerError::io(format!("read {what}"), e))?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ServerError::Internal(format!("read {what}: no pipes")));
    };
    let read = async move {
        let mut out = Vec::new();
        stdout
            .take(max_bytes as u64 + 1)
            .read_to_end(&mut out)
            .await?;
        let mut err = Vec::new();
        stderr.take(64 << 10).read_to_end(&mut err).await?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out, err))
    };
    let fail = |message: String| ServerError::from(ProviderError::failed("local", message));
    let too_slow = || {
        ServerError::from(ProviderError::timed_out_message(
            "local",
            format!(
                "reading {what} did not finish within {} s",
                limit.as_secs().max(1)
            ),
        ))
    };
    // A grace over the inner limit for nsenter itself.
    let (status, out, err) = match tokio::time::timeout(limit + Duration::from_secs(5), read).await
    {
        Err(_) => return Err(too_slow()),
        Ok(Err(e)) => return Err(ServerError::io(format!("read {what}"), e)),
        Ok(Ok(done)) => done,
    };
    if out.len() > max_bytes {
        return Err(ProviderError::too_large(
            "local",
            format!("{what} is larger than {max_bytes} bytes"),
        )
        .into());
    }
    match status.code() {
        Some(0) => Ok(out),
        // timeout(1): 124 after TERM, 137 after KILL.
        Some(124) | Some(137) | None => Err(too_slow()),
        Some(_) => Err(fail(String::from_utf8_lossy(&err).trim().to_string())),
    }
}

/// How much later than the caller's limit the command is killed inside the
/// instance: the caller's own timeout (which kills nsenter and answers
/// `ProviderTimeout`) comes first; this one makes sure the command itself
/// does not outlive it (nsenter's child is not killed with nsenter).
const EXEC_KILL_AFTER: Duration = Duration::from_secs(2);

/// `argv` run under `timeout -s KILL` inside the instance (timeout kills
/// the command's whole process group).
fn bounded_exec_argv(argv: &[String], limit: Duration) -> Vec<String> {
    let secs = (limit + EXEC_KILL_AFTER).as_secs().max(1).to_string();
    ["timeout", "-s", "KILL", &secs]
        .iter()
        .map(|a| a.to_string())
        .chain(argv.iter().cloned())
        .collect()
}

/// Everything `reader` gives, of which at most `max_bytes` are kept (the
/// rest is read and dropped, so the command never blocks on a full pipe);
/// the flag says whether anything was dropped.
async fn read_capped(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    max_bytes: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut cut = false;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, cut));
        }
        let room = max_bytes - kept.len();
        kept.extend_from_slice(&buf[..n.min(room)]);
        cut |= n > room;
    }
}

/// Runs an exec command (nsenter …, `bounded_exec_argv` inside) within
/// `limit`, each stream capped at `max_output`; past the limit nsenter is
/// killed (`kill_on_drop`) and the answer is `ProviderTimeout`.
async fn run_bounded_exec(
    command: std::process::Command,
    id: &str,
    limit: Duration,
    max_output: usize,
) -> Result<crate::provider::ExecOutput> {
    let mut command = tokio::process::Command::from(command);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| ServerError::io(format!("run a command inside {id}"), e))?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ServerError::Internal(format!("exec inside {id}: no pipes")));
    };
    let run = async move {
        let (out, err) = tokio::try_join!(
            read_capped(stdout, max_output),
            read_capped(stderr, max_output)
        )?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out, err))
    };
    match tokio::time::timeout(limit, run).await {
        Err(_) => Err(crate::provider::timed_out("local", "exec", id, limit)),
        Ok(Err(e)) => Err(ServerError::io(format!("run a command inside {id}"), e)),
        Ok(Ok((status, (stdout, stdout_cut), (stderr, stderr_cut)))) => {
            Ok(crate::provider::ExecOutput {
                code: status.code().unwrap_or(-1),
                stdout,
                stderr,
                stdout_cut,
                stderr_cut,
            })
        }
    }
}

fn not_found_is_none<T>(r: knit_local::Result<T>) -> knit_local::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(LocalError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn name(&self) -> &str {
        "local"
    }

    fn gateway(&self) -> Option<std::net::IpAddr> {
        Some(self.gateway.into())
    }

    fn default_zone(&self) -> Option<String> {
        // The local cloud's instance attributes, unless a template names one.
        Some(knit_local::model::Attributes::default().zone_id)
    }

    async fn create(&self, template: &InstanceTemplate) -> Result<ProviderInstance> {
        let mut tpl = local_template(template);
        // Benchmarks stand for a cloud network: every instance's link shaped
        // (tc on both veth ends) when KNIT_LOCAL_BANDWIDTH_MBIT is set.
        tpl.bandwidth_mbit = std::env::var("KNIT_LOCAL_BANDWIDTH_MBIT")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|m| *m > 0);
        self.blocking(move |c| c.create(&tpl))
            .await
            .map(|i| view(&i))
    }

    async fn get(&self, id: &str) -> Result<Option<ProviderInstance>> {
        let id = id.to_string();
        Ok(self
            .blocking(move |c| not_found_is_none(c.describe(&id)))
            .await?
            .map(|i| view(&i)))
    }

    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        let list = self
            .blocking(|c| {
                // knit-local's list reads each instance's files; one being
                // deleted at that moment can vanish mid-read: read again.
                let mut attempt = 0;
                loop {
                    match c.list() {
                        Err(LocalError::NotFound { .. }) if attempt < 5 => {
                            attempt += 1;
                            std::thread::sleep(std::time::Duration::from_millis(20));
                        }
                        other => return other,
                    }
                }
            })
            .await?;
        Ok(list.iter().map(view).collect())
    }

    async fn start(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.blocking(move |c| c.start(&id)).await.map(|_| ())
    }

    async fn stop(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.blocking(move |c| c.stop(&id)).await.map(|_| ())
    }

    async fn reboot(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.blocking(move |c| c.reboot(&id)).await.map(|_| ())
    }

    async fn reimage(&self, id: &str, image: &str, user_data: &str) -> Result<()> {
        let root = base_root(image);
        let (id, user_data) = (id.to_string(), user_data.to_string());
        // knit-local checks the image before it stops the instance.
        self.blocking(move |c| c.reimage_from(&id, Some(user_data), Some(&root)))
            .await
            .map(|_| ())
    }

    async fn check_image(&self, image: &str) -> Result<()> {
        check_host_image(image, host_image_allowed())?;
        knit_local::check_base_root(&base_root(image)).map_err(|rule| {
            ProviderError::refused("local", format!("image {image:?} {rule}")).into()
        })
    }

    async fn check_instance_types(&self, types: &[String]) -> Result<Option<TypeCheck>> {
        Ok(Some(local_type_check(types)))
    }

    async fn rename(&self, id: &str, name: &str) -> Result<()> {
        let (id, name) = (id.to_string(), name.to_string());
        self.blocking(move |c| c.rename(&id, &name))
            .await
            .map(|_| ())
    }

    async fn set_password(&self, id: &str, password: &str) -> Result<()> {
        let (id, password) = (id.to_string(), password.to_string());
        // knit-local's errors never carry the password.
        self.blocking(move |c| c.set_password(&id, &password))
            .await
            .map(|_| ())
    }

    async fn delete(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.blocking(move |c| c.delete(&id)).await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        self.read_file_limited(id, path, READ_FILE_MAX_BYTES, READ_FILE_TIMEOUT)
            .await
    }

    /// Bounded on both sides: inside the instance `timeout` kills the reader
    /// (a FIFO blocks in open(2) forever) and `head` stops one byte past the
    /// cap (/dev/zero never ends); here at most that much is read, and the
    /// whole exec is killed when it outlives the limit.
    async fn read_file_limited(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
        limit: Duration,
    ) -> Result<Vec<u8>> {
        let argv = bounded_read_argv(path, max_bytes, limit);
        let target = id.to_string();
        let command = self
            .blocking(move |c| c.exec_command(&target, &argv))
            .await?;
        run_bounded_read(command, &format!("{path} inside {id}"), max_bytes, limit).await
    }

    async fn snapshot_create(
        &self,
        id: &str,
        data_disk_index: usize,
        name: &str,
    ) -> Result<ProviderSnapshot> {
        let (id, name) = (id.to_string(), name.to_string());
        let snap = self
            .blocking(move |c| {
                let instance = c.describe(&id)?;
                let disk = instance.data_disks.get(data_disk_index).ok_or_else(|| {
                    LocalError::NotFound {
                        kind: "data disk",
                        id: format!("{id} #{data_disk_index}"),
                    }
                })?;
                c.snapshot_create_named(&disk.id, Some(&name))
            })
            .await?;
        Ok(ProviderSnapshot {
            id: snap.id,
            size_bytes: snap.size,
        })
    }

    async fn snapshot_delete(&self, snapshot_id: &str) -> Result<()> {
        let id = snapshot_id.to_string();
        self.blocking(move |c| c.snapshot_delete(&id)).await
    }

    async fn snapshots_named(&self, name: &str) -> Result<Vec<String>> {
        let name = name.to_string();
        let all = self.blocking(|c| c.snapshots()).await?;
        Ok(all
            .into_iter()
            .filter(|s| s.name.as_deref() == Some(name.as_str()))
            .map(|s| s.id)
            .collect())
    }

    async fn facts(&self, id: &str) -> Result<crate::preflight::InstanceFacts> {
        let id = id.to_string();
        let instance = self.blocking(move |c| c.describe(&id)).await?;
        Ok(local_facts(&instance))
    }

    async fn exec(&self, id: &str, argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        let out = self
            .exec_limited(id, argv, EXEC_TIMEOUT, EXEC_OUTPUT_MAX_BYTES)
            .await?;
        Ok(out.into_parts())
    }

    /// Bounded at the source: at most `max_output` bytes of each stream are
    /// kept in memory, nsenter is killed after `limit` and the command
    /// itself (under `timeout -s KILL` inside) just after.
    async fn exec_limited(
        &self,
        id: &str,
        argv: &[String],
        limit: Duration,
        max_output: usize,
    ) -> Result<crate::provider::ExecOutput> {
        let inner = bounded_exec_argv(argv, limit);
        let target = id.to_string();
        let command = self
            .blocking(move |c| c.exec_command(&target, &inner))
            .await?;
        run_bounded_exec(command, id, limit, max_output).await
    }
}

/// The local cloud's attributes as preflight facts (simulated cloud objects).
pub fn local_facts(i: &knit_local::Instance) -> preflight::InstanceFacts {
    let r = &i.record;
    let a = &r.template.attributes;
    let os = a.os.clone().unwrap_or_else(|| r.os.clone());
    preflight::InstanceFacts {
        id: r.id.clone(),
        name: r
            .template
            .name
            .clone()
            .unwrap_or_else(|| r.hostname.clone()),
        state: if r.state.to_string() == "running" && !i.alive {
            "dead".into()
        } else {
            r.state.to_string()
        },
        ip: Some(r.private_ip.clone()),
        instance_type: r.template.instance_type.clone(),
        account_id: a.account_id.clone(),
        region_id: a.region_id.clone(),
        zone_id: a.zone_id.clone(),
        vpc_id: a.vpc_id.clone(),
        v_switch_id: a.v_switch_id.clone(),
        security_groups: a
            .security_groups
            .iter()
            .map(|g| preflight::SecurityGroupFacts {
                id: g.id.clone(),
                kind: match g.kind {
                    knit_local::SecurityGroupType::Normal => "normal".into(),
                    knit_local::SecurityGroupType::Enterprise => "enterprise".into(),
                },
                rules: g
                    .rules
                    .iter()
                    .map(|x| preflight::RuleFacts {
                        direction: x.direction.clone(),
                        protocol: x.protocol.clone(),
                        port_range: x.port_range.clone(),
                        cidr: x.cidr.clone(),
                        policy: x.policy.clone(),
                    })
                    .collect(),
            })
            .collect(),
        eni_count: a.enis.count,
        max_enis: a.instance_type_limits.max_enis,
        max_ips_per_eni: a.instance_type_limits.max_ips_per_eni,
        ram_role: a.ram_role.clone(),
        ipv6: a.ipv6,
        swap: a.swap,
        os_id: os.id,
        os_version: os.version_id,
        os_name: os.pretty_name,
        tags: a.tags.clone(),
        password_login: a.login.password.is_some(),
        data_disks: i
            .data_disks
            .iter()
            .map(|d| preflight::DiskFacts {
                id: d.id.clone(),
                device: d.device.clone(),
                size_bytes: d.size,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_local_cloud_knows_the_catalog_and_its_own_types() {
        let asked = [
            "local.small",
            "ecs.g7.large",
            "ecs.nope.large",
            "ecs.t1.small",
        ];
        let asked: Vec<String> = asked.iter().map(|t| t.to_string()).collect();
        let check = local_type_check(&asked);
        assert_eq!(check.unknown, vec!["ecs.nope.large".to_string()]);
        assert_eq!(check.examples.len(), TYPE_EXAMPLES, "{check:?}");
        assert_eq!(check.examples[..2], ["local.small", "ecs.g7.large"]);
        for e in &check.examples {
            assert!(knit_local::bounds::type_size(e).is_some(), "{e}");
        }
    }

    /// Each LocalError maps to its kind; the message and code are the
    /// local cloud's, as users read them.
    #[test]
    fn local_errors_map_to_kinds() {
        use crate::provider::ProviderErrorKind as K;
        let io = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let cases: Vec<(LocalError, K)> = vec![
            (
                LocalError::NotFound {
                    kind: "instance",
                    id: "i-1".into(),
                },
                K::NotFound,
            ),
            (
                LocalError::OutOfCapacity {
                    instance_type: "ecs.g7.large".into(),
                    used: 1,
                    capacity: 1,
                },
                K::Capacity,
            ),
            (
                LocalError::HostOutOfCapacity {
                    resource: "fs.inotify.max_user_instances",
                    used: 128,
                    limit: 128,
                    detail: "d".into(),
                },
                K::Capacity,
            ),
            (
                LocalError::Busy {
                    what: "i-1".into(),
                    message: "m".into(),
                },
                K::Transient,
            ),
            (
                LocalError::WrongState {
                    id: "i-1".into(),
                    state: "Stopping".into(),
                    action: "start",
                    wanted: "Stopped",
                },
                K::Transient,
            ),
            (
                LocalError::Io {
                    context: "read",
                    path: "/x".into(),
                    source: io(),
                },
                K::Transient,
            ),
            (LocalError::NotRoot { uid: 1000 }, K::Auth),
            (
                LocalError::Parse {
                    what: "t".into(),
                    message: "m".into(),
                },
                K::Permanent,
            ),
            (
                LocalError::Command {
                    command: "ip".into(),
                    status: "1".into(),
                    stderr: "e".into(),
                },
                K::Permanent,
            ),
        ];
        crate::provider_error::assert_maps_to_kinds("local", cases, LocalError::code, err);
    }

    #[test]
    fn the_host_image_needs_the_unsafe_switch() {
        let e = check_host_image("host", false).expect_err("refused");
        assert!(e.to_string().contains(UNSAFE_HOST_IMAGE_ENV), "{e}");
        assert!(check_host_image("host", true).is_ok());
        assert!(check_host_image(knit_api::DEFAULT_IMAGE, false).is_ok());
        assert!(check_host_image("/var/lib/images/x", false).is_ok());
    }

    use super::*;
    use crate::provider::DiskTemplate;

    /// The bounded read itself, run on this host (inside an instance it is
    /// the same argv behind nsenter): a FIFO nobody writes, /dev/zero behind
    /// a symlink, a small file, a missing one.
    #[tokio::test]
    async fn bounded_read_stops_a_fifo_and_an_endless_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("result.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let zero = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let small = dir.path().join("small.json");
        std::fs::write(&small, b"{}").unwrap();
        let read = |path: &std::path::Path, max: usize| {
            let argv = bounded_read_argv(path.to_str().unwrap(), max, Duration::from_secs(1));
            let mut command = std::process::Command::new(&argv[0]);
            command.args(&argv[1..]);
            run_bounded_read(command, "the file", max, Duration::from_secs(1))
        };
        let e = read(&fifo, 1024).await.unwrap_err().to_string();
        assert!(e.contains("did not finish within 1 s"), "{e}");
        assert!(crate::provider::is_limit_error(
            &read(&fifo, 1024).await.unwrap_err()
        ));
        let e = read(&zero, 1 << 20).await.unwrap_err();
        assert!(e.to_string().contains("larger than 1048576 bytes"), "{e}");
        assert!(crate::provider::is_limit_error(&e));
        assert_eq!(read(&small, 2).await.unwrap(), b"{}");
        assert!(read(&small, 1)
            .await
            .unwrap_err()
            .to_string()
            .contains("larger than 1 bytes"));
        let e = read(&dir.path().join("absent"), 10).await.unwrap_err();
        assert!(e.to_string().contains("No such file"), "{e}");
        assert!(!crate::provider::is_limit_error(&e));
    }

    /// The bounded exec itself, run on this host (inside an instance it is
    /// the same argv behind nsenter): an endless stream is cut at the cap
    /// with the exit code kept, an exit code comes back, a command past its
    /// limit is a ProviderTimeout.
    #[tokio::test]
    async fn bounded_exec_cuts_output_and_stops_a_slow_command() {
        let run = |argv: &[&str], limit: Duration, cap: usize| {
            let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
            let inner = bounded_exec_argv(&argv, limit);
            let mut command = std::process::Command::new(&inner[0]);
            command.args(&inner[1..]);
            run_bounded_exec(command, "i-test", limit, cap)
        };
        let out = run(
            &["head", "-c", "1000000", "/dev/zero"],
            Duration::from_secs(60),
            1000,
        )
        .await
        .unwrap();
        assert_eq!(
            (out.code, out.stdout.len(), out.stdout_cut),
            (0, 1000, true)
        );
        assert!(!out.stderr_cut);
        let out = run(
            &["sh", "-c", "echo out; echo err >&2; exit 7"],
            Duration::from_secs(60),
            1000,
        )
        .await
        .unwrap();
        assert_eq!(
            (out.code, &out.stdout[..], &out.stderr[..]),
            (7, &b"out\n"[..], &b"err\n"[..])
        );
        assert!(!out.stdout_cut && !out.stderr_cut);
        let e = run(&["sleep", "4"], Duration::from_secs(1), 1000)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ServerError::ProviderTimeout { operation, instance, limit_secs: 1, .. }
                if operation == "exec" && instance == "i-test"),
            "{e}"
        );
        assert!(crate::provider::is_limit_error(&e));
    }

    #[test]
    fn template_maps_pool_settings() {
        let t = InstanceTemplate {
            name: "workers-abcde".into(),
            instance_type: "ecs.g7.large".into(),
            image: "host".into(),
            system_disk_gib: 40,
            data_disks: vec![
                DiskTemplate {
                    size_gib: 40,
                    interface: "nvme".into(),
                    snapshot_id: None,
                },
                DiskTemplate {
                    size_gib: 0,
                    interface: "virtio".into(),
                    snapshot_id: Some("s-1".into()),
                },
            ],
            user_data: "#!/bin/bash\n".into(),
            region: "local".into(),
            zone: Some("local-b".into()),
            vpc: "vpc-local".into(),
            tags: [(TAG_NAME.to_string(), "workers-abcde".to_string())]
                .into_iter()
                .collect(),
            light: true,
        };
        let l = local_template(&t);
        l.validate().unwrap();
        assert!(l.light, "a pool's runtime: none reaches the local cloud");
        assert_eq!(l.disks[0].interface, DiskInterface::Nvme);
        assert_eq!(l.disks[1].size, None);
        assert_eq!(l.disks[1].snapshot.as_deref(), Some("s-1"));
        assert_eq!(l.attributes.zone_id, "local-b");
        assert_eq!(l.system_disk_size.bytes(), Some(40 << 30));
    }
}
