//! Where instances come from. The reconciler speaks only this trait; the
//! local cloud (knit-local) is the implementation that exists today.

#[cfg(feature = "ecs")]
pub mod ecs;
pub(crate) mod fallback;
pub mod local;
#[cfg(feature = "qemu")]
pub mod qemu;

use crate::error::Result;
pub use crate::provider_error::{ProviderError, ProviderErrorKind};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Which provider a server runs (`knit server --provider`), parsed once at
/// the edge; the rest of the program matches on it, never on its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// The local cloud (knit-local).
    Local,
    /// QEMU VMs on the local cloud's bridge.
    Qemu,
    /// Alibaba Cloud ECS.
    Ecs,
    /// Store and API only: no instance is made.
    None,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 4] = [
        ProviderKind::Local,
        ProviderKind::Qemu,
        ProviderKind::Ecs,
        ProviderKind::None,
    ];

    /// The word `--provider` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::Qemu => "qemu",
            ProviderKind::Ecs => "ecs",
            ProviderKind::None => "none",
        }
    }

    /// Whether its instances sit on the local cloud's bridge (and reach
    /// this host at its gateway).
    pub fn on_local_bridge(self) -> bool {
        matches!(self, ProviderKind::Local | ProviderKind::Qemu)
    }

    /// The cargo feature it needs (`None`: always built in).
    pub fn feature(self) -> Option<crate::features::Feature> {
        use crate::features::Feature;
        match self {
            ProviderKind::Ecs => Some(Feature::Ecs),
            ProviderKind::Qemu => Some(Feature::Qemu),
            ProviderKind::Local | ProviderKind::None => None,
        }
    }
}

#[cfg(test)]
mod kind_tests {
    use super::ProviderKind;
    use crate::features::Feature;

    #[test]
    fn every_provider_word_parses_back_and_names_its_feature() {
        assert_eq!(ProviderKind::Ecs.feature(), Some(Feature::Ecs));
        assert_eq!(ProviderKind::Qemu.feature(), Some(Feature::Qemu));
        assert_eq!(ProviderKind::Local.feature(), None);
        assert_eq!(ProviderKind::None.feature(), None);
        // Every word --provider takes parses back to its kind; others are
        // refused naming the flag, the value and the words.
        for kind in ProviderKind::ALL {
            assert_eq!(kind.as_str().parse::<ProviderKind>(), Ok(kind));
        }
        let err = "aws".parse::<ProviderKind>().unwrap_err();
        assert_eq!(
            err,
            "--provider \"aws\": must be one of local, qemu, ecs, none"
        );
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ProviderKind {
    type Err = String;

    /// The field, the value and the rule, as every refusal of input.
    fn from_str(word: &str) -> std::result::Result<ProviderKind, String> {
        ProviderKind::ALL
            .into_iter()
            .find(|k| k.as_str() == word)
            .ok_or_else(|| {
                let words: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("--provider {word:?}: must be one of {}", words.join(", "))
            })
    }
}

/// Largest file [`Provider::read_file`] returns (`knit logs`).
pub const READ_FILE_MAX_BYTES: usize = 16 << 20;
/// How long [`Provider::read_file`] may take.
pub const READ_FILE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a provider call about one instance (get, list, stop, start,
/// delete) may take before the reconciler gives up on it for this pass.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// How long making one instance may take (disks from snapshots included).
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(900);

/// How long [`Provider::exec`] may take: a backstop against a provider
/// that never answers, as long as the longest command a caller runs through
/// it (the snapshot builder's image pulls: `imagesTimeoutSeconds` up to
/// 86 400 s, which the builder bounds itself). Callers that know their
/// command's bound give it to [`Provider::exec_limited`] (`knit exec`: at
/// most 300 s).
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(86_400 + 300);
/// Largest stdout, and largest stderr, [`Provider::exec`] returns: a longer
/// stream is cut there and ends with [`EXEC_CUT_MARKER`].
pub const EXEC_OUTPUT_MAX_BYTES: usize = 16 << 20;
/// The line a cut exec stream ends with (only [`ExecOutput::into_parts`]
/// adds it; [`ExecOutput`] says so in its flags).
pub const EXEC_CUT_MARKER: &str = "\n[knit: output cut: over the limit]\n";
/// What [`BoundedProvider`] adds to a limit the provider enforces itself
/// (a bounded read, a killed command), so that the provider's own, more
/// precise error is the one callers see.
pub const LIMIT_GRACE: Duration = Duration::from_secs(10);

/// Whether `e` is a read or call that went past its time or size limit
/// (from [`within`], [`BoundedProvider`] or a bounded read), rather than a
/// plain failure.
pub fn is_limit_error(e: &crate::error::ServerError) -> bool {
    match e {
        crate::error::ServerError::ProviderTimeout { .. } => true,
        crate::error::ServerError::Provider(e) => e.is_limit(),
        _ => false,
    }
}

/// What a command run inside an instance gave back, each stream at most the
/// cap the call was given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecOutput {
    /// The command's exit status; -1 when it ended by a signal.
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// stdout was longer than the cap and was cut.
    pub stdout_cut: bool,
    pub stderr_cut: bool,
}

impl ExecOutput {
    /// Cuts each stream to `max_bytes` (no-op when already within).
    pub fn capped(mut self, max_bytes: usize) -> ExecOutput {
        if self.stdout.len() > max_bytes {
            self.stdout.truncate(max_bytes);
            self.stdout_cut = true;
        }
        if self.stderr.len() > max_bytes {
            self.stderr.truncate(max_bytes);
            self.stderr_cut = true;
        }
        self
    }

    /// The tuple [`Provider::exec`] returns; a cut stream ends with
    /// [`EXEC_CUT_MARKER`] so that no reader takes it for the whole output.
    pub fn into_parts(mut self) -> (i32, Vec<u8>, Vec<u8>) {
        if self.stdout_cut {
            self.stdout.extend_from_slice(EXEC_CUT_MARKER.as_bytes());
        }
        if self.stderr_cut {
            self.stderr.extend_from_slice(EXEC_CUT_MARKER.as_bytes());
        }
        (self.code, self.stdout, self.stderr)
    }
}

/// `call` unless it takes longer than `limit`: then a provider error
/// naming `what` and the limit. Every provider call of the reconciler goes
/// through this, so a provider that never answers holds up nothing else.
pub async fn within<T>(
    provider: &str,
    what: &str,
    limit: Duration,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(outcome) => outcome,
        Err(_) => Err(ProviderError::timed_out(provider, what, limit).into()),
    }
}

/// Tag every knit-made instance carries: the pool it belongs to.
pub const TAG_POOL: &str = "knit.dev/pool";
/// Tag carrying knit's own instance name (the store's key), so that an
/// instance made just before a crash is found again by name.
pub const TAG_NAME: &str = "knit.dev/name";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskTemplate {
    pub size_gib: i64,
    /// virtio | nvme.
    pub interface: String,
    pub snapshot_id: Option<String>,
}

/// Everything a provider needs to make one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceTemplate {
    /// knit's name for the instance; unique, chosen before creation.
    pub name: String,
    pub instance_type: String,
    /// `host` or an image directory.
    pub image: String,
    pub system_disk_gib: i64,
    pub data_disks: Vec<DiskTemplate>,
    pub user_data: String,
    pub region: String,
    pub zone: Option<String>,
    pub vpc: String,
    pub tags: BTreeMap<String, String>,
    /// The node runs no container runtime (the pool's `runtime: none`): a
    /// host-carried cloud (the local one) counts no runtime's share of
    /// host limits for it; a real cloud ignores it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub light: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderInstance {
    /// The provider's instance id (`i-…`).
    pub id: String,
    /// knit's name (the `knit.dev/name` tag), when the instance carries one.
    pub name: Option<String>,
    /// Provider's state word (e.g. Running, Stopped).
    pub state: String,
    pub ip: Option<String>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSnapshot {
    pub id: String,
    pub size_bytes: u64,
}

/// A provider's answer about a pool's instance types
/// ([`Provider::check_instance_types`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TypeCheck {
    /// The asked types the provider cannot make, in the order asked.
    pub unknown: Vec<String>,
    /// A few types it can make (at most [`TYPE_EXAMPLES`]), for the message.
    pub examples: Vec<String>,
}

/// How many known types a refusal lists.
pub const TYPE_EXAMPLES: usize = 5;

#[async_trait]
pub trait Provider: Send + Sync {
    /// Short name for messages and events (`local`).
    fn name(&self) -> &str;
    /// The host's address on the instances' network (the local cloud's
    /// bridge gateway for its subnet): where instances reach the control
    /// plane by default. `None`: the provider has no such address.
    fn gateway(&self) -> Option<std::net::IpAddr> {
        None
    }
    /// The zone an instance made without a pool `zone` lands in, for the
    /// Node's `topology.kubernetes.io/zone`; `None`: not known here.
    fn default_zone(&self) -> Option<String> {
        None
    }
    async fn create(&self, template: &InstanceTemplate) -> Result<ProviderInstance>;
    async fn get(&self, id: &str) -> Result<Option<ProviderInstance>>;
    async fn list(&self) -> Result<Vec<ProviderInstance>>;
    async fn start(&self, id: &str) -> Result<()>;
    async fn stop(&self, id: &str) -> Result<()>;
    /// New system disk from `image` (a pool's `image`: `host` or an image
    /// directory), data disks kept, new user data. An image the provider
    /// cannot use is refused before the instance is touched.
    async fn reimage(&self, id: &str, image: &str, user_data: &str) -> Result<()>;
    /// Refuses an image (a pool's `image`) the provider cannot use, naming
    /// it and the rule; changes nothing.
    async fn check_image(&self, image: &str) -> Result<()>;
    /// Which of `types` (a pool's `spec.instanceTypes`) the provider cannot
    /// make, with a few it can for the message: asked at pool write.
    /// `None` (the default): the provider keeps no list of types and every
    /// name is accepted (its create says the rest).
    async fn check_instance_types(&self, types: &[String]) -> Result<Option<TypeCheck>> {
        let _ = types;
        Ok(None)
    }
    /// Renames an instance (its name and hostname), running or stopped.
    async fn rename(&self, id: &str, name: &str) -> Result<()>;
    /// Sets root's login password inside a running instance. The password
    /// must never reach a log, an event, an error, a process's argv or any
    /// store.
    async fn set_password(&self, id: &str, password: &str) -> Result<()>;
    async fn delete(&self, id: &str) -> Result<()>;
    /// A file from inside the instance (`knit logs`), at most
    /// [`READ_FILE_MAX_BYTES`] within [`READ_FILE_TIMEOUT`] where the
    /// provider can bound it (see [`Provider::read_file_limited`]).
    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>>;

    /// A file from inside the instance, refused when larger than
    /// `max_bytes` or slower than `limit` (a FIFO, /dev/zero, a hung file
    /// system). Providers that can read with a bound override this; the
    /// default bounds the time and checks the size after the read.
    async fn read_file_limited(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
        limit: Duration,
    ) -> Result<Vec<u8>> {
        let what = format!("reading {path} inside {id}");
        let data = within(self.name(), &what, limit, self.read_file(id, path)).await?;
        if data.len() > max_bytes {
            return Err(ProviderError::too_large(
                self.name(),
                format!("{path} inside {id} is larger than {max_bytes} bytes"),
            )
            .into());
        }
        Ok(data)
    }

    /// Restarts a running instance (node repair). Default: stop, then
    /// start.
    async fn reboot(&self, id: &str) -> Result<()> {
        self.stop(id).await?;
        self.start(id).await
    }
    /// Snapshot of one data disk of a (stopped) instance, by its index
    /// among the instance's data disks. `name` is recorded with it before
    /// the copy starts, so that [`Provider::snapshots_named`] finds it even
    /// when the caller died before the id came back.
    async fn snapshot_create(
        &self,
        id: &str,
        data_disk_index: usize,
        name: &str,
    ) -> Result<ProviderSnapshot>;
    async fn snapshot_delete(&self, snapshot_id: &str) -> Result<()>;
    /// The ids of the provider's snapshots carrying `name`, made whole or
    /// not. A provider that keeps no snapshot names has none to find.
    async fn snapshots_named(&self, name: &str) -> Result<Vec<String>> {
        let _ = name;
        Ok(Vec::new())
    }

    /// Runs a command inside a running instance (the snapshot builder's
    /// steps): exit status, stdout, stderr. Providers without a way in
    /// refuse.
    async fn exec(&self, id: &str, argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        let _ = (id, argv);
        Err(ProviderError::refused(
            self.name(),
            "running commands inside instances is not supported",
        )
        .into())
    }

    /// [`Provider::exec`] bounded: the command is ended (killed where the
    /// provider can) after `limit`, which is then a
    /// [`crate::error::ServerError::ProviderTimeout`], and each stream is cut
    /// at `max_output` bytes. Providers that can bound at the source (stop
    /// reading, kill the command) override this; the default bounds the time
    /// and cuts after the read.
    async fn exec_limited(
        &self,
        id: &str,
        argv: &[String],
        limit: Duration,
        max_output: usize,
    ) -> Result<ExecOutput> {
        let (code, stdout, stderr) = match tokio::time::timeout(limit, self.exec(id, argv)).await {
            Ok(outcome) => outcome?,
            Err(_) => return Err(timed_out(self.name(), "exec", id, limit)),
        };
        Ok(ExecOutput {
            code,
            stdout,
            stderr,
            ..ExecOutput::default()
        }
        .capped(max_output))
    }

    /// The cloud account the provider makes instances in: the cluster's
    /// own account for the add-existing preflight (`same-account`). `None`
    /// (the default): the provider has no account of its own, the
    /// preflight's default (the local cloud's) stands.
    async fn account_id(&self) -> Result<Option<String>> {
        Ok(None)
    }
    /// What the add-existing preflight reads about an instance (account,
    /// VPC, security groups, ENIs, OS, disks …). Providers that cannot
    /// tell refuse.
    async fn facts(&self, id: &str) -> Result<crate::preflight::InstanceFacts> {
        let _ = id;
        Err(ProviderError::refused(
            self.name(),
            "instance attributes for preflight are not supported",
        )
        .into())
    }

    /// The instance knit named `name`, if the provider has it.
    async fn find_by_name(&self, name: &str) -> Result<Option<ProviderInstance>> {
        Ok(self.list().await?.into_iter().find(|i| {
            i.name.as_deref() == Some(name)
                || i.tags.get(TAG_NAME).map(String::as_str) == Some(name)
        }))
    }
}

/// The typed error of a provider call that outlived `limit`.
pub fn timed_out(
    provider: &str,
    operation: &str,
    instance: &str,
    limit: Duration,
) -> crate::error::ServerError {
    crate::error::ServerError::ProviderTimeout {
        provider: provider.to_string(),
        operation: operation.to_string(),
        instance: instance.to_string(),
        limit_secs: limit.as_secs_f64().ceil() as u64,
    }
}

/// The time limits [`BoundedProvider`] puts on each kind of provider call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// get, list, start, stop, reboot, delete, rename, set_password,
    /// check_image, check_instance_types, facts, snapshot_delete,
    /// snapshots_named, find_by_name.
    pub call: Duration,
    /// create, reimage, snapshot_create: they copy disks.
    pub create: Duration,
    /// read_file (a caller of read_file_limited gives its own).
    pub read_file: Duration,
    /// exec (a caller of exec_limited gives its own).
    pub exec: Duration,
    /// Largest stdout and stderr of any exec.
    pub exec_output_max: usize,
}

impl Default for CallLimits {
    fn default() -> CallLimits {
        CallLimits {
            call: CALL_TIMEOUT,
            create: CREATE_TIMEOUT,
            read_file: READ_FILE_TIMEOUT,
            exec: EXEC_TIMEOUT,
            exec_output_max: EXEC_OUTPUT_MAX_BYTES,
        }
    }
}

/// Any provider with every call bounded: the control plane installs it
/// around its provider ([`crate::control::ControlPlane::new`]), so no
/// caller (reconciler, attach, snapshots, API, preflight) can wait on a
/// provider forever or take an unbounded command output into memory. A call
/// past its limit is a [`crate::error::ServerError::ProviderTimeout`]
/// naming the operation, the instance and the limit.
pub struct BoundedProvider {
    inner: std::sync::Arc<dyn Provider>,
    limits: CallLimits,
}

impl BoundedProvider {
    pub fn new(inner: std::sync::Arc<dyn Provider>, limits: CallLimits) -> BoundedProvider {
        BoundedProvider { inner, limits }
    }

    /// `inner` with the default limits, as the trait object callers use.
    pub fn wrap(inner: std::sync::Arc<dyn Provider>) -> std::sync::Arc<dyn Provider> {
        std::sync::Arc::new(BoundedProvider::new(inner, CallLimits::default()))
    }

    async fn bound<T>(
        &self,
        operation: &str,
        instance: &str,
        limit: Duration,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(limit, call).await {
            Ok(outcome) => outcome,
            Err(_) => Err(timed_out(self.inner.name(), operation, instance, limit)),
        }
    }
}

#[async_trait]
impl Provider for BoundedProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn gateway(&self) -> Option<std::net::IpAddr> {
        self.inner.gateway()
    }
    fn default_zone(&self) -> Option<String> {
        self.inner.default_zone()
    }
    async fn create(&self, template: &InstanceTemplate) -> Result<ProviderInstance> {
        let limit = self.limits.create;
        self.bound("create", &template.name, limit, self.inner.create(template))
            .await
    }
    async fn get(&self, id: &str) -> Result<Option<ProviderInstance>> {
        self.bound("get", id, self.limits.call, self.inner.get(id))
            .await
    }
    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        self.bound("list", "(all)", self.limits.call, self.inner.list())
            .await
    }
    async fn start(&self, id: &str) -> Result<()> {
        self.bound("start", id, self.limits.call, self.inner.start(id))
            .await
    }
    async fn stop(&self, id: &str) -> Result<()> {
        self.bound("stop", id, self.limits.call, self.inner.stop(id))
            .await
    }
    async fn reimage(&self, id: &str, image: &str, user_data: &str) -> Result<()> {
        let call = self.inner.reimage(id, image, user_data);
        self.bound("reimage", id, self.limits.create, call).await
    }
    async fn check_image(&self, image: &str) -> Result<()> {
        let call = self.inner.check_image(image);
        self.bound("check_image", image, self.limits.call, call)
            .await
    }
    async fn check_instance_types(&self, types: &[String]) -> Result<Option<TypeCheck>> {
        let call = self.inner.check_instance_types(types);
        self.bound("check_instance_types", "(types)", self.limits.call, call)
            .await
    }
    async fn rename(&self, id: &str, name: &str) -> Result<()> {
        let call = self.inner.rename(id, name);
        self.bound("rename", id, self.limits.call, call).await
    }
    async fn set_password(&self, id: &str, password: &str) -> Result<()> {
        let call = self.inner.set_password(id, password);
        self.bound("set_password", id, self.limits.call, call).await
    }
    async fn delete(&self, id: &str) -> Result<()> {
        self.bound("delete", id, self.limits.call, self.inner.delete(id))
            .await
    }
    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        let limit = self.limits.read_file;
        self.read_file_limited(id, path, READ_FILE_MAX_BYTES, limit)
            .await
    }
    async fn read_file_limited(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
        limit: Duration,
    ) -> Result<Vec<u8>> {
        let call = self.inner.read_file_limited(id, path, max_bytes, limit);
        let data = self
            .bound("read_file", id, limit + LIMIT_GRACE, call)
            .await?;
        if data.len() > max_bytes {
            return Err(ProviderError::too_large(
                self.name(),
                format!("{path} inside {id} is larger than {max_bytes} bytes"),
            )
            .into());
        }
        Ok(data)
    }
    async fn reboot(&self, id: &str) -> Result<()> {
        self.bound("reboot", id, self.limits.call, self.inner.reboot(id))
            .await
    }
    async fn snapshot_create(
        &self,
        id: &str,
        data_disk_index: usize,
        name: &str,
    ) -> Result<ProviderSnapshot> {
        let call = self.inner.snapshot_create(id, data_disk_index, name);
        self.bound("snapshot_create", id, self.limits.create, call)
            .await
    }
    async fn snapshot_delete(&self, snapshot_id: &str) -> Result<()> {
        let call = self.inner.snapshot_delete(snapshot_id);
        self.bound("snapshot_delete", snapshot_id, self.limits.call, call)
            .await
    }
    async fn snapshots_named(&self, name: &str) -> Result<Vec<String>> {
        let call = self.inner.snapshots_named(name);
        self.bound("snapshots_named", name, self.limits.call, call)
            .await
    }
    async fn exec(&self, id: &str, argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        let (limit, max) = (self.limits.exec, self.limits.exec_output_max);
        Ok(self.exec_limited(id, argv, limit, max).await?.into_parts())
    }
    /// The caller's limit and cap, the cap never above this provider's.
    async fn exec_limited(
        &self,
        id: &str,
        argv: &[String],
        limit: Duration,
        max_output: usize,
    ) -> Result<ExecOutput> {
        let max = max_output.min(self.limits.exec_output_max);
        let call = self.inner.exec_limited(id, argv, limit, max);
        let out = self.bound("exec", id, limit + LIMIT_GRACE, call).await?;
        Ok(out.capped(max))
    }
    async fn account_id(&self) -> Result<Option<String>> {
        let call = self.inner.account_id();
        self.bound("account_id", "(account)", self.limits.call, call)
            .await
    }
    async fn facts(&self, id: &str) -> Result<crate::preflight::InstanceFacts> {
        self.bound("facts", id, self.limits.call, self.inner.facts(id))
            .await
    }
    async fn find_by_name(&self, name: &str) -> Result<Option<ProviderInstance>> {
        let call = self.inner.find_by_name(name);
        self.bound("find_by_name", name, self.limits.call, call)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_stream_says_so_and_a_whole_one_is_untouched() {
        let out = ExecOutput {
            code: 3,
            stdout: vec![b'x'; 10],
            stderr: b"ok".to_vec(),
            ..ExecOutput::default()
        }
        .capped(4);
        assert!(out.stdout_cut && !out.stderr_cut);
        let (code, stdout, stderr) = out.into_parts();
        assert_eq!(code, 3);
        assert_eq!(stdout, format!("xxxx{EXEC_CUT_MARKER}").into_bytes());
        assert_eq!(stderr, b"ok");
    }
}
