//! Alibaba Cloud ECS as a [`Provider`]: real instances, cloud disks and
//! snapshots through the ECS OpenAPI (knit-ecs). Every call goes through
//! knit-ecs's one signed client on tokio's blocking pool; waits for a state
//! poll DescribeInstances / DescribeDisks / DescribeSnapshots with a limit.
//! Commands inside instances (exec, read_file, the preflight's OS facts) go
//! through Cloud Assistant, paged so that no answer exceeds its 24 KB
//! output limit.

use crate::error::{Result, ServerError};
use crate::preflight::{DiskFacts, InstanceFacts, RuleFacts, SecurityGroupFacts};
use crate::provider::{
    timed_out, ExecOutput, InstanceTemplate, Provider, ProviderError, ProviderErrorKind,
    ProviderInstance, ProviderSnapshot, TypeCheck, EXEC_OUTPUT_MAX_BYTES, EXEC_TIMEOUT,
    READ_FILE_MAX_BYTES, READ_FILE_TIMEOUT, TAG_NAME, TYPE_EXAMPLES,
};
use async_trait::async_trait;
use base64::Engine;
use knit_ecs::api::{
    DataDisk, DescribeInstances, DescribeSnapshots, Instance, ModifyInstanceAttribute,
    RunInstances, StoppedMode,
};
use knit_ecs::{Client, ClientConfig, Credentials, EcsError, RetryPolicy};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::{Duration, Instant};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Bytes of a file read by one Cloud Assistant command: base64 makes
/// 16 KiB into 21 848 characters, under the 24 KB output limit.
const CHUNK: usize = 16 * 1024;
/// Output of an exec returned inline (base64 of both streams stays under
/// the output limit); larger output is read back in chunks.
const INLINE_OUTPUT: usize = 12 * 1024;
/// Cloud Assistant's largest `Timeout` for one command (a day); a
/// longer `exec` limit is cut to it.
const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(86_400);
/// Tag carrying knit's snapshot name (SnapshotName has ECS's own rules).
const TAG_SNAPSHOT_NAME: &str = "knit.dev/snapshot-name";
/// knit's node image name (a pool's default `image`).
const KNIT_NODE_IMAGE: &str = "debian-12";

/// Where and how the provider makes instances.
#[derive(Debug, Clone)]
pub struct EcsSettings {
    pub region: String,
    /// A private endpoint or a test's fake, for ECS and STS alike.
    pub endpoint: Option<String>,
    /// The vSwitch new instances join (it fixes VPC and zone).
    pub v_switch_id: Option<String>,
    pub security_group_ids: Vec<String>,
    /// The ECS image used for a pool whose `image` is `host`.
    pub default_image: Option<String>,
    pub disk_category: String,
    pub poll_interval: Duration,
    /// Longest wait for one state (Running, Stopped, a disk, a snapshot).
    pub wait_limit: Duration,
    pub retry: RetryPolicy,
}

impl EcsSettings {
    pub fn new(region: &str) -> EcsSettings {
        EcsSettings {
            region: region.to_string(),
            endpoint: None,
            v_switch_id: None,
            security_group_ids: Vec::new(),
            default_image: None,
            disk_category: "cloud_essd".into(),
            poll_interval: Duration::from_secs(5),
            wait_limit: Duration::from_secs(600),
            retry: RetryPolicy::default(),
        }
    }
}

impl EcsSettings {
    /// What ECS needs before any instance can be made, as the `knit server`
    /// flags that give it (empty: nothing missing). The server checks it at
    /// start, so that a missing setting stops it there instead of failing
    /// every create in its log.
    pub fn missing_required(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.region.trim().is_empty() {
            missing.push("--region <id> (e.g. cn-shanghai)");
        }
        if self
            .v_switch_id
            .as_deref()
            .is_none_or(|v| v.trim().is_empty())
        {
            missing.push(
                "--ecs-vswitch <vsw-…> (the vSwitch new instances join: it fixes VPC and zone)",
            );
        }
        if self.security_group_ids.iter().all(|g| g.trim().is_empty()) {
            missing.push("--ecs-security-group <sg-…> (comma-separated for several)");
        }
        if self
            .default_image
            .as_deref()
            .is_none_or(|i| i.trim().is_empty())
        {
            missing.push(
                "--ecs-image <ECS image id> (aliyun_3_x64_20G_alibase_….vhd, m-…: the image of pools whose image is debian-12 or host; a pool may name another ECS image id in spec.image)",
            );
        }
        missing
    }
}

pub struct EcsProvider {
    client: Arc<Client>,
    settings: EcsSettings,
    account: tokio::sync::OnceCell<String>,
}

fn err(e: EcsError) -> ServerError {
    ProviderError::new("ecs", kind_of(&e), e.code(), format!("{e} [{}]", e.code())).into()
}

/// ECS's error Codes that mean "no room for this instance type here now",
/// where another type may have room.
const CAPACITY_CODES: &[&str] = &[
    "OperationDenied.NoStock",
    "NoStock",
    "Zone.NotOnSale",
    "NotOnSale",
    "InvalidInstanceType.NotSupported",
    "InvalidResourceType.NotSupported",
    "ResourceNotAvailable",
];

/// ECS's error Codes of a resource between states (an instance stopping, a
/// snapshot not yet whole): the same call later may pass.
const BUSY_CODES: &[&str] = &[
    "IncorrectInstanceStatus",
    "IncorrectDiskStatus",
    "InstanceNotRunning",
    "InvalidSnapshotId.NotReady",
];

/// ECS's error Codes (or their first part) that mean the credentials are
/// missing, wrong or lack the permission.
const AUTH_CODES: &[&str] = &[
    "InvalidAccessKeyId",
    "InvalidAccessKeySecret",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "InvalidSecurityToken",
    "Forbidden",
    "NoPermission",
    "MissingAuthorization",
    "InvalidAuthorization",
];

/// The kind of an ECS error, by the API's error Code (never its message).
pub fn kind_of(e: &EcsError) -> ProviderErrorKind {
    match e {
        // Not by HTTP status: ECS answers 403 for states and stock too
        // (IncorrectInstanceStatus, OperationDenied.NoStock).
        EcsError::Api { code, .. } => {
            // The part before the first dot (`Forbidden.RAM` → `Forbidden`).
            let head = code.split('.').next().unwrap_or(code);
            if CAPACITY_CODES.contains(&code.as_str()) {
                ProviderErrorKind::Capacity
            } else if AUTH_CODES.contains(&head) {
                ProviderErrorKind::Auth
            } else if e.is_not_found() {
                ProviderErrorKind::NotFound
            } else if head == "Throttling" {
                ProviderErrorKind::Throttled
            } else if e.is_retryable() || BUSY_CODES.contains(&code.as_str()) {
                ProviderErrorKind::Transient
            } else {
                ProviderErrorKind::Permanent
            }
        }
        EcsError::Transport { .. } | EcsError::Timeout(_) => ProviderErrorKind::Transient,
        EcsError::Credentials(_) => ProviderErrorKind::Auth,
        EcsError::Decode { .. } | EcsError::Invalid(_) => ProviderErrorKind::Permanent,
    }
}

fn fail(message: String) -> ServerError {
    ProviderError::failed("ecs", message).into()
}

/// A wait for a state (an instance's, a disk's, a snapshot's) that did not
/// come within the provider's wait limit: it may yet come.
fn waited(message: String) -> ServerError {
    ProviderError::new("ecs", ProviderErrorKind::Transient, "EcsTimeout", message).into()
}

/// A ClientToken (at most 64 ASCII characters) that is the same for the
/// same `parts` in every process, so a request repeated after a crash is
/// recognised by ECS.
pub fn client_token(kind: &str, parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    format!("knit-{kind}-{}", &hex::encode(h.finalize())[..40])
}

/// The scripts sent through Cloud Assistant; their values go in as quoted
/// assignments ([`script`]).
const READ_CHUNK_SH: &str = include_str!("scripts/ecs-read-chunk.sh");
const EXEC_SH: &str = include_str!("scripts/ecs-exec.sh");
const REMOVE_DIR_SH: &str = include_str!("scripts/ecs-remove-dir.sh");
const FACTS_SH: &str = include_str!("scripts/ecs-facts.sh");

/// `template` with `values` (and `args`) as quoted assignments before it.
fn render_script(template: &str, values: &[(&str, &str)], args: &[&str]) -> Result<String> {
    knit_api::shell::render(template, values, args).map_err(|e| fail(e.to_string()))
}

/// ECS's state word as knit's providers spell them (`running`).
fn state_word(status: &str) -> String {
    status.to_ascii_lowercase()
}

fn view(i: &Instance) -> ProviderInstance {
    let tags = i.tags.map();
    ProviderInstance {
        id: i.instance_id.clone(),
        name: tags
            .get(TAG_NAME)
            .cloned()
            .or_else(|| Some(i.instance_name.clone()).filter(|n| !n.is_empty())),
        state: state_word(&i.status),
        ip: i.private_ip(),
        tags,
    }
}

/// SnapshotName must start with a letter and not with `auto`.
fn ecs_snapshot_name(name: &str) -> String {
    let ok = name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && !name.to_ascii_lowercase().starts_with("auto")
        && !name.starts_with("http");
    if ok {
        name.to_string()
    } else {
        format!("knit-{name}")
    }
}

/// `/dev/xvdb` (ECS's name) → `vdb` (the guest's).
fn guest_device(device: &str) -> Option<String> {
    let d = device.strip_prefix("/dev/")?;
    Some(
        d.strip_prefix("xvd")
            .map(|r| format!("vd{r}"))
            .unwrap_or_else(|| d.to_string()),
    )
}

fn rule(p: &knit_ecs::api::Permission) -> Option<RuleFacts> {
    let cidr = if p.direction == "egress" {
        &p.dest_cidr_ip
    } else {
        &p.source_cidr_ip
    };
    // A rule naming a security group or prefix list instead of a CIDR does
    // not open the port to arbitrary peers: left out.
    if cidr.is_empty() {
        return None;
    }
    Some(RuleFacts {
        direction: p.direction.to_ascii_lowercase(),
        protocol: p.ip_protocol.to_ascii_lowercase(),
        port_range: Some(p.port_range.clone()).filter(|r| !r.is_empty() && r != "-1/-1"),
        cidr: Some(cidr.clone()),
        policy: p.policy.to_ascii_lowercase(),
    })
}

/// os-release's `KEY=value` (quotes removed).
fn os_release_field(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_default()
}

impl EcsProvider {
    pub fn new(settings: EcsSettings, credentials: Credentials) -> Result<EcsProvider> {
        let mut config =
            ClientConfig::new(&settings.region, settings.endpoint.as_deref()).map_err(err)?;
        config.retry = settings.retry.clone();
        Ok(EcsProvider {
            client: Arc::new(Client::new(config, credentials)),
            settings,
            account: tokio::sync::OnceCell::new(),
        })
    }

    /// Runs blocking client work on tokio's blocking pool.
    async fn ecs<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Client) -> std::result::Result<T, EcsError> + Send + 'static,
    ) -> Result<T> {
        self.ecs_typed(f).await?.map_err(err)
    }

    /// [`Self::ecs`] with ECS's error as it is, for callers that act on
    /// its code.
    async fn ecs_typed<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Client) -> std::result::Result<T, EcsError> + Send + 'static,
    ) -> Result<std::result::Result<T, EcsError>> {
        let client = self.client.clone();
        tokio::task::spawn_blocking(move || f(&client))
            .await
            .map_err(|e| ServerError::Internal(format!("ECS task: {e}")))
    }

    async fn describe(&self, id: &str) -> Result<Option<Instance>> {
        let id = id.to_string();
        self.ecs(move |c| c.describe_instance(&id)).await
    }

    /// Polls until the instance's status is `want`.
    async fn wait_status(&self, id: &str, want: &str) -> Result<Instance> {
        let started = Instant::now();
        loop {
            let Some(i) = self.describe(id).await? else {
                return Err(ServerError::NotFound {
                    kind: "ECS instance",
                    name: id.to_string(),
                });
            };
            if i.status == want && i.operation_locks.lock_reason.is_empty() {
                return Ok(i);
            }
            if started.elapsed() > self.settings.wait_limit {
                return Err(waited(format!(
                    "instance {id} is {} after {} s, waiting for {want}",
                    i.status,
                    self.settings.wait_limit.as_secs()
                )));
            }
            tokio::time::sleep(self.settings.poll_interval).await;
        }
    }

    /// The ECS image id for a pool's `image`.
    fn image_id(&self, image: &str) -> Result<String> {
        let refuse = |rule: &str| {
            Err(ProviderError::refused("ecs", format!("image {image:?}: {rule}")).into())
        };
        // knit's own image names (the node image, the host's root) have no
        // meaning on ECS: the server's --ecs-image stands for them.
        if image == "host" || image == KNIT_NODE_IMAGE {
            return match &self.settings.default_image {
                Some(i) => Ok(i.clone()),
                None => refuse(
                    "knit's image names have no meaning on ECS: start the server with \
                     --ecs-image <ECS image id> (aliyun_3_x64_20G_alibase_….vhd, m-…), or set the \
                     pool's image to an ECS image id",
                ),
            };
        }
        let ok = !image.is_empty()
            && image.len() <= 128
            && !image.starts_with('/')
            && image
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if ok {
            Ok(image.to_string())
        } else {
            refuse("must be an ECS image id (letters, digits, '.', '_', '-'), not a directory")
        }
    }

    fn v_switch(&self) -> Result<String> {
        self.settings.v_switch_id.clone().ok_or_else(|| {
            fail(
                "no vSwitch: start the server with --ecs-vswitch <vsw-…> (it fixes VPC and zone)"
                    .into(),
            )
        })
    }

    /// Starts a shell script through Cloud Assistant and waits for it:
    /// exit code and output. Refuses output the limit cut short.
    async fn run_script(
        &self,
        id: &str,
        script: String,
        limit: Duration,
    ) -> Result<(i64, Vec<u8>)> {
        let started = Instant::now();
        let mut token_bytes = [0u8; 16];
        getrandom::getrandom(&mut token_bytes)
            .map_err(|e| ServerError::Internal(format!("random: {e}")))?;
        // Unique per command: a repeat after a lost answer is de-duplicated,
        // a second command with the same text is not.
        let token = format!("knit-cmd-{}", hex::encode(token_bytes));
        let timeout = limit.min(MAX_COMMAND_TIMEOUT).as_secs().max(10);
        let (iid, s) = (id.to_string(), script);
        let invoke = self
            .ecs(move |c| c.run_command(&iid, &s, timeout, &token))
            .await?;
        loop {
            let (iid, inv) = (id.to_string(), invoke.clone());
            let r = self
                .ecs(move |c| c.describe_invocation_result(&inv, &iid))
                .await?;
            if let Some(r) = r {
                let finished = matches!(
                    r.invocation_status.as_str(),
                    "Success"
                        | "Failed"
                        | "Timeout"
                        | "Error"
                        | "Stopped"
                        | "Cancelled"
                        | "Terminated"
                ) || matches!(
                    r.invoke_record_status.as_str(),
                    "Finished" | "Failed" | "Stopped"
                );
                if finished {
                    if r.invocation_status == "Timeout" {
                        return Err(ProviderError::timed_out_message(
                            "ecs",
                            format!("command inside {id} did not finish within {timeout} s"),
                        )
                        .into());
                    }
                    if r.dropped > 0 {
                        return Err(fail(format!(
                            "command output inside {id} was cut by {} bytes at Cloud Assistant's limit",
                            r.dropped
                        )));
                    }
                    if matches!(
                        r.invocation_status.as_str(),
                        "Error" | "Cancelled" | "Stopped" | "Terminated"
                    ) {
                        return Err(fail(format!(
                            "Cloud Assistant command inside {id} ended {}: {} {}",
                            r.invocation_status, r.error_code, r.error_info
                        )));
                    }
                    let output = B64.decode(r.output.trim()).map_err(|e| {
                        fail(format!("Cloud Assistant output of {id} is not base64: {e}"))
                    })?;
                    return Ok((r.exit_code, output));
                }
            }
            if started.elapsed() > limit {
                return Err(ProviderError::timed_out_message(
                    "ecs",
                    format!(
                        "command inside {id} did not finish within {} s",
                        limit.as_secs()
                    ),
                )
                .into());
            }
            tokio::time::sleep(self.settings.poll_interval).await;
        }
    }

    /// A regular file inside the instance, read in chunks that each fit
    /// Cloud Assistant's output limit; refused when larger than `max`.
    async fn read_chunked(
        &self,
        id: &str,
        path: &str,
        max: usize,
        limit: Duration,
    ) -> Result<Vec<u8>> {
        match self.read_chunks(id, path, max, limit).await? {
            (_, true) => Err(ProviderError::too_large(
                "ecs",
                format!("{path} inside {id} is larger than {max} bytes"),
            )
            .into()),
            (data, false) => Ok(data),
        }
    }

    /// At most `max` bytes of a regular file inside the instance, and
    /// whether there was more: reading stops at the chunk past the cap.
    async fn read_chunks(
        &self,
        id: &str,
        path: &str,
        max: usize,
        limit: Duration,
    ) -> Result<(Vec<u8>, bool)> {
        let started = Instant::now();
        let mut data = Vec::new();
        for index in 0.. {
            let left = limit.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(ProviderError::timed_out_message(
                    "ecs",
                    format!(
                        "reading {path} inside {id} did not finish within {} s",
                        limit.as_secs()
                    ),
                )
                .into());
            }
            let script = render_script(
                READ_CHUNK_SH,
                &[
                    ("file", path),
                    ("secs", &left.as_secs().max(1).to_string()),
                    ("chunk", &CHUNK.to_string()),
                    ("index", &index.to_string()),
                ],
                &[],
            )?;
            let (code, out) = self.run_script(id, script, left).await?;
            if code != 0 {
                return Err(fail(format!(
                    "{path} inside {id}: {}",
                    String::from_utf8_lossy(&out).trim()
                )));
            }
            let chunk = B64
                .decode(String::from_utf8_lossy(&out).trim())
                .map_err(|e| fail(format!("reading {path} inside {id}: bad chunk: {e}")))?;
            let last = chunk.len() < CHUNK;
            data.extend_from_slice(&chunk);
            if data.len() > max {
                data.truncate(max);
                return Ok((data, true));
            }
            if last {
                break;
            }
        }
        Ok((data, false))
    }

    /// A command inside the instance, ended after `limit` inside the
    /// instance itself (`timeout -s KILL`, and Cloud Assistant's own
    /// Timeout just after), each stream cut at `max_output` bytes without
    /// reading past it. The streams go to files in a `mktemp -d` directory:
    /// small ones come back in the same answer, larger ones in chunks.
    pub async fn exec_bounded(
        &self,
        id: &str,
        argv: &[String],
        limit: Duration,
        max_output: usize,
    ) -> Result<ExecOutput> {
        if argv.is_empty() {
            return Err(fail("exec: an empty command".into()));
        }
        let secs = limit.as_secs().max(1);
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let script = render_script(
            EXEC_SH,
            &[
                ("secs", &secs.to_string()),
                ("inline", &INLINE_OUTPUT.to_string()),
            ],
            &args,
        )?;
        let (code, out) = self
            .run_script(id, script, limit + Duration::from_secs(60))
            .await?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let mut lines = text.lines();
        let head: Vec<&str> = lines
            .next()
            .and_then(|l| l.strip_prefix("knit-exec "))
            .map(|l| l.splitn(4, ' ').collect())
            .unwrap_or_default();
        if code != 0 || head.len() != 4 {
            return Err(fail(format!(
                "exec inside {id} could not start (exit {code}): {}",
                text.trim()
            )));
        }
        let status: i32 = head[0].parse().unwrap_or(-1);
        let (out_len, err_len): (usize, usize) =
            (head[1].parse().unwrap_or(0), head[2].parse().unwrap_or(0));
        let dir = head[3].to_string();
        let output = if out_len + err_len <= INLINE_OUTPUT {
            let decode = |l: Option<&str>| {
                B64.decode(l.unwrap_or("").trim())
                    .map_err(|e| fail(format!("exec inside {id}: output is not base64: {e}")))
            };
            let stdout = decode(lines.next())?;
            let stderr = decode(lines.next())?;
            ExecOutput {
                code: status,
                stdout,
                stderr,
                ..ExecOutput::default()
            }
        } else {
            let stdout = self
                .read_chunks(id, &format!("{dir}/out"), max_output, READ_FILE_TIMEOUT)
                .await;
            let stderr = self
                .read_chunks(id, &format!("{dir}/err"), max_output, READ_FILE_TIMEOUT)
                .await;
            // Removed whatever the reads did.
            if let Ok(remove) = render_script(REMOVE_DIR_SH, &[("dir", &dir)], &[]) {
                let _ = self.run_script(id, remove, Duration::from_secs(60)).await;
            }
            let ((stdout, stdout_cut), (stderr, stderr_cut)) = (stdout?, stderr?);
            ExecOutput {
                code: status,
                stdout,
                stderr,
                stdout_cut,
                stderr_cut,
            }
        };
        // timeout(1) with -s KILL: 137 when it ended the command.
        if status == 137 {
            return Err(timed_out("ecs", "exec", id, limit));
        }
        Ok(output.capped(max_output))
    }

    /// RebootInstance, waited for until Running again.
    pub async fn reboot_instance(&self, id: &str) -> Result<()> {
        let i = self.wait_status(id, "Running").await?;
        let iid = i.instance_id.clone();
        self.ecs(move |c| c.reboot_instance(&iid, false)).await?;
        self.wait_status(id, "Running").await.map(|_| ())
    }

    /// A regular file inside the instance, refused when larger than
    /// `max_bytes` or slower than `limit`: bounded inside the instance
    /// (`timeout`, one chunk per command) and here (the loop's deadline).
    pub async fn read_file_bounded(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
        limit: Duration,
    ) -> Result<Vec<u8>> {
        self.read_chunked(id, path, max_bytes, limit).await
    }

    /// The key's account (STS GetCallerIdentity), asked once.
    async fn caller_account(&self) -> Result<String> {
        self.account
            .get_or_try_init(|| async {
                self.ecs(|c| c.get_caller_identity().map(|i| i.account_id))
                    .await
            })
            .await
            .cloned()
    }
}

#[async_trait]
impl Provider for EcsProvider {
    fn name(&self) -> &str {
        "ecs"
    }

    async fn create(&self, template: &InstanceTemplate) -> Result<ProviderInstance> {
        let image = self.image_id(&template.image)?;
        let mut tags = template.tags.clone();
        tags.insert(TAG_NAME.to_string(), template.name.clone());
        let request = RunInstances {
            zone_id: template.zone.clone(),
            image_id: image,
            instance_type: template.instance_type.clone(),
            v_switch_id: Some(self.v_switch()?),
            security_group_ids: self.settings.security_group_ids.clone(),
            instance_name: template.name.clone(),
            host_name: Some(template.name.clone()),
            user_data: template.user_data.clone(),
            system_disk_gib: Some(template.system_disk_gib),
            system_disk_category: Some(self.settings.disk_category.clone()),
            data_disks: template
                .data_disks
                .iter()
                .map(|d| DataDisk {
                    // A disk from a snapshot takes the snapshot's size.
                    size_gib: if d.snapshot_id.is_some() {
                        None
                    } else {
                        Some(d.size_gib)
                    },
                    snapshot_id: d.snapshot_id.clone(),
                    category: Some(self.settings.disk_category.clone()),
                    delete_with_instance: true,
                })
                .collect(),
            tags,
            // Derived from knit's name: a create repeated after a crash gets
            // the instance the first one made.
            client_token: client_token("run", &[&template.name]),
        };
        let id = match self
            .ecs_typed({
                let r = request.clone();
                move |c| c.run_instances(&r)
            })
            .await?
        {
            Ok(id) => id,
            // The same name was used with other settings (a pool changed
            // between a crash and the retry): the instance it made is the
            // one knit named.
            Err(e) if e.code() == "IdempotentParameterMismatch" => {
                match self.find_by_name(&template.name).await? {
                    Some(found) => found.id,
                    None => return Err(err(e)),
                }
            }
            Err(e) => return Err(err(e)),
        };
        let running = self.wait_status(&id, "Running").await?;
        Ok(view(&running))
    }

    async fn get(&self, id: &str) -> Result<Option<ProviderInstance>> {
        Ok(self.describe(id).await?.map(|i| view(&i)))
    }

    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        let all = self
            .ecs(|c| c.describe_instances(&DescribeInstances::default()))
            .await?;
        Ok(all.iter().map(view).collect())
    }

    async fn find_by_name(&self, name: &str) -> Result<Option<ProviderInstance>> {
        let filter = DescribeInstances {
            tags: [(TAG_NAME.to_string(), name.to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let found = self.ecs(move |c| c.describe_instances(&filter)).await?;
        Ok(found.first().map(view))
    }

    async fn start(&self, id: &str) -> Result<()> {
        let i = self
            .describe(id)
            .await?
            .ok_or_else(|| ServerError::NotFound {
                kind: "ECS instance",
                name: id.to_string(),
            })?;
        if i.status != "Running" && i.status != "Starting" {
            if i.status == "Stopping" {
                self.wait_status(id, "Stopped").await?;
            }
            let iid = id.to_string();
            self.ecs(move |c| c.start_instance(&iid)).await?;
        }
        self.wait_status(id, "Running").await.map(|_| ())
    }

    async fn stop(&self, id: &str) -> Result<()> {
        let i = self
            .describe(id)
            .await?
            .ok_or_else(|| ServerError::NotFound {
                kind: "ECS instance",
                name: id.to_string(),
            })?;
        if i.status != "Stopped" && i.status != "Stopping" {
            if i.status == "Starting" || i.status == "Pending" {
                self.wait_status(id, "Running").await?;
            }
            let iid = id.to_string();
            self.ecs(move |c| c.stop_instance(&iid, StoppedMode::KeepCharging, false))
                .await?;
        }
        self.wait_status(id, "Stopped").await.map(|_| ())
    }

    async fn reimage(&self, id: &str, image: &str, user_data: &str) -> Result<()> {
        // Checked before the instance is touched.
        let image = self.image_id(image)?;
        self.stop(id).await?;
        let modify = ModifyInstanceAttribute {
            instance_id: id.to_string(),
            user_data: Some(user_data.to_string()),
            ..Default::default()
        };
        self.ecs(move |c| c.modify_instance_attribute(&modify))
            .await?;
        let digest = hex::encode(Sha256::digest(user_data.as_bytes()));
        let token = client_token("reimage", &[id, &image, &digest]);
        let (iid, img) = (id.to_string(), image.clone());
        let disk = self
            .ecs(move |c| c.replace_system_disk(&iid, &img, None, &token))
            .await?;
        // The new system disk is usable when it is In_use with no lock.
        let started = Instant::now();
        loop {
            let iid = id.to_string();
            let disks = self.ecs(move |c| c.describe_disks(&iid, "system")).await?;
            let ready = disks.iter().any(|d| {
                (disk.is_empty() || d.disk_id == disk)
                    && d.status == "In_use"
                    && d.operation_locks.lock_reason.is_empty()
            });
            if ready {
                break;
            }
            if started.elapsed() > self.settings.wait_limit {
                return Err(waited(format!(
                    "new system disk {disk} of {id} not In_use after {} s",
                    self.settings.wait_limit.as_secs()
                )));
            }
            tokio::time::sleep(self.settings.poll_interval).await;
        }
        self.start(id).await
    }

    async fn check_image(&self, image: &str) -> Result<()> {
        self.image_id(image).map(|_| ())
    }

    /// DescribeInstanceTypes for the asked types (at most 10, as a pool
    /// lists): those ECS does not answer are unknown. The examples, only
    /// when one is unknown: the types of its family ECS has (one more call),
    /// else those knit's catalog names that ECS confirms (one more).
    async fn check_instance_types(&self, types: &[String]) -> Result<Option<TypeCheck>> {
        let asked = types.to_vec();
        let known = self.ecs(move |c| c.describe_instance_types(&asked)).await?;
        let unknown: Vec<String> = types
            .iter()
            .filter(|t| !known.iter().any(|k| &k.instance_type_id == *t))
            .cloned()
            .collect();
        let Some(first) = unknown.first() else {
            return Ok(Some(TypeCheck::default()));
        };
        let mut examples = Vec::new();
        if let Some((family, _)) = first.rsplit_once('.') {
            let family = family.to_string();
            let of_family = self
                .ecs(move |c| c.describe_instance_types_of_family(&family))
                .await?;
            examples.extend(of_family.into_iter().map(|t| t.instance_type_id));
        }
        if examples.is_empty() {
            let mut families = Vec::new();
            let mut catalog = Vec::new();
            for t in knit_api::instance_types::all() {
                if catalog.len() < 10 && !families.contains(&t.family()) {
                    families.push(t.family());
                    catalog.push(t.name.to_string());
                }
            }
            let confirmed = self
                .ecs(move |c| c.describe_instance_types(&catalog))
                .await?;
            examples.extend(confirmed.into_iter().map(|t| t.instance_type_id));
        }
        examples.sort();
        examples.dedup();
        examples.truncate(TYPE_EXAMPLES);
        Ok(Some(TypeCheck { unknown, examples }))
    }

    /// ModifyInstanceAttribute InstanceName + HostName. ECS gives a new
    /// HostName to the OS only at the instance's next start: a stopped
    /// instance takes it when started (automatic attach's re-image starts
    /// it); a running one is given it now, inside, through Cloud Assistant
    /// (`/etc/hostname`, then hostnamectl or hostname), so that it needs no
    /// restart: a manual attach renames the machine while its attach
    /// command runs on it, and a restart would cut that command off.
    async fn rename(&self, id: &str, name: &str) -> Result<()> {
        let modify = ModifyInstanceAttribute {
            instance_id: id.to_string(),
            instance_name: Some(name.to_string()),
            host_name: Some(name.to_string()),
            ..Default::default()
        };
        self.ecs(move |c| c.modify_instance_attribute(&modify))
            .await?;
        let running = self
            .describe(id)
            .await?
            .is_some_and(|i| i.status == "Running");
        if !running {
            return Ok(());
        }
        // knit's one guest-hostname routine; a running name it cannot set
        // is a warning (the OS takes ECS's HostName at its next start).
        let script =
            knit_api::shell::guest_hostname(name, None, knit_api::shell::LiveHostname::Try)
                .map_err(|e| fail(e.to_string()))?;
        match self.run_script(id, script, Duration::from_secs(120)).await {
            Ok((0, _)) => {}
            // The name is ECS's already and the OS takes it at its next
            // start; the node's name does not depend on it.
            Ok((code, out)) => tracing::warn!(
                instance = id,
                code,
                output = %String::from_utf8_lossy(&out).trim(),
                "renamed at ECS; setting the host name inside failed, it applies at the next start"
            ),
            Err(e) => tracing::warn!(
                instance = id,
                error = %e,
                "renamed at ECS; Cloud Assistant could not set the host name inside, it applies at the next start"
            ),
        }
        Ok(())
    }

    async fn set_password(&self, id: &str, password: &str) -> Result<()> {
        let modify = ModifyInstanceAttribute {
            instance_id: id.to_string(),
            password: Some(password.to_string()),
            ..Default::default()
        };
        // knit-ecs's errors never carry a request's parameters.
        self.ecs(move |c| c.modify_instance_attribute(&modify))
            .await?;
        // ECS applies a new password at the next start.
        match self.describe(id).await? {
            Some(i) if i.status == "Running" => self.reboot_instance(id).await,
            _ => Ok(()),
        }
    }

    async fn delete(&self, id: &str) -> Result<()> {
        let iid = id.to_string();
        // Gone already is done; a wrong key (InvalidAccessKeyId.NotFound)
        // is not.
        match self
            .ecs_typed(move |c| c.delete_instance(&iid, true))
            .await?
        {
            Ok(()) => Ok(()),
            Err(e) if e.code() == "InvalidInstanceId.NotFound" => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        self.read_file_bounded(id, path, READ_FILE_MAX_BYTES, READ_FILE_TIMEOUT)
            .await
    }

    async fn read_file_limited(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
        limit: Duration,
    ) -> Result<Vec<u8>> {
        self.read_file_bounded(id, path, max_bytes, limit).await
    }

    /// RebootInstance rather than the default stop and start.
    async fn reboot(&self, id: &str) -> Result<()> {
        self.reboot_instance(id).await
    }

    async fn snapshot_create(
        &self,
        id: &str,
        data_disk_index: usize,
        name: &str,
    ) -> Result<ProviderSnapshot> {
        let iid = id.to_string();
        let mut disks = self.ecs(move |c| c.describe_disks(&iid, "data")).await?;
        disks.sort_by(|a, b| a.device.cmp(&b.device));
        let disk = disks
            .get(data_disk_index)
            .ok_or_else(|| ServerError::NotFound {
                kind: "data disk",
                name: format!("{id} #{data_disk_index}"),
            })?;
        let disk_id = disk.disk_id.clone();
        let tags = [(TAG_SNAPSHOT_NAME.to_string(), name.to_string())]
            .into_iter()
            .collect();
        let token = client_token("snap", &[id, &disk_id, name]);
        let ecs_name = ecs_snapshot_name(name);
        let snap_id = self
            .ecs(move |c| c.create_snapshot(&disk_id, &ecs_name, &tags, &token))
            .await?;
        let started = Instant::now();
        loop {
            let f = DescribeSnapshots {
                snapshot_ids: vec![snap_id.clone()],
                ..Default::default()
            };
            let found = self.ecs(move |c| c.describe_snapshots(&f)).await?;
            match found.first() {
                Some(s) if s.status == "accomplished" => {
                    return Ok(ProviderSnapshot {
                        id: s.snapshot_id.clone(),
                        size_bytes: s.source_disk_size << 30,
                    })
                }
                Some(s) if s.status == "failed" => {
                    return Err(fail(format!("snapshot {snap_id} of {id} failed")))
                }
                _ => {}
            }
            if started.elapsed() > self.settings.wait_limit {
                return Err(waited(format!(
                    "snapshot {snap_id} of {id} not accomplished after {} s",
                    self.settings.wait_limit.as_secs()
                )));
            }
            tokio::time::sleep(self.settings.poll_interval).await;
        }
    }

    async fn snapshot_delete(&self, snapshot_id: &str) -> Result<()> {
        let sid = snapshot_id.to_string();
        match self.ecs_typed(move |c| c.delete_snapshot(&sid)).await? {
            Ok(()) => Ok(()),
            Err(e) if e.code() == "InvalidSnapshotId.NotFound" => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    async fn snapshots_named(&self, name: &str) -> Result<Vec<String>> {
        let f = DescribeSnapshots {
            snapshot_name: Some(ecs_snapshot_name(name)),
            ..Default::default()
        };
        let name = name.to_string();
        let found = self.ecs(move |c| c.describe_snapshots(&f)).await?;
        Ok(found
            .into_iter()
            .filter(|s| s.tags.map().get(TAG_SNAPSHOT_NAME) == Some(&name))
            .map(|s| s.snapshot_id)
            .collect())
    }

    async fn exec(&self, id: &str, argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        Ok(self
            .exec_bounded(id, argv, EXEC_TIMEOUT, EXEC_OUTPUT_MAX_BYTES)
            .await?
            .into_parts())
    }

    async fn exec_limited(
        &self,
        id: &str,
        argv: &[String],
        limit: Duration,
        max_output: usize,
    ) -> Result<ExecOutput> {
        self.exec_bounded(id, argv, limit, max_output).await
    }

    /// The key's account: instances knit makes are in it, and the cluster
    /// is (the preflight's `same-account` compares with it).
    async fn account_id(&self) -> Result<Option<String>> {
        self.caller_account().await.map(Some)
    }

    async fn facts(&self, id: &str) -> Result<InstanceFacts> {
        let i = self
            .describe(id)
            .await?
            .ok_or_else(|| ServerError::NotFound {
                kind: "ECS instance",
                name: id.to_string(),
            })?;
        let account_id = self.caller_account().await?;
        let itype = vec![i.instance_type.clone()];
        let limits = self.ecs(move |c| c.describe_instance_types(&itype)).await?;
        let limit = limits
            .iter()
            .find(|t| t.instance_type_id == i.instance_type);
        let group_ids = i.security_group_ids.security_group_id.clone();
        let ids = group_ids.clone();
        let kinds = if ids.is_empty() {
            Vec::new()
        } else {
            self.ecs(move |c| c.describe_security_groups(&ids)).await?
        };
        let mut security_groups = Vec::new();
        for g in group_ids {
            let gid = g.clone();
            let attr = self
                .ecs(move |c| c.describe_security_group_attribute(&gid))
                .await?;
            security_groups.push(SecurityGroupFacts {
                kind: kinds
                    .iter()
                    .find(|k| k.security_group_id == g)
                    .map(|k| k.security_group_type.clone())
                    .unwrap_or_else(|| "normal".into()),
                id: g,
                rules: attr
                    .permissions
                    .permission
                    .iter()
                    .filter_map(rule)
                    .collect(),
            });
        }
        let iid = id.to_string();
        let ram_role = self
            .ecs(move |c| c.describe_instance_ram_role(&iid))
            .await?;
        let iid = id.to_string();
        let mut disks = self.ecs(move |c| c.describe_disks(&iid, "data")).await?;
        disks.sort_by(|a, b| a.device.cmp(&b.device));
        // What only the guest knows (OS release, swap), read through Cloud
        // Assistant while it runs; ECS's OS name otherwise.
        let (mut os_id, mut os_version, mut os_name, mut swap) =
            (String::new(), String::new(), i.os_name_en.clone(), false);
        if i.status == "Running" {
            match self
                .run_script(id, FACTS_SH.into(), Duration::from_secs(120))
                .await
            {
                Ok((0, out)) => {
                    let text = String::from_utf8_lossy(&out);
                    let (release, swaps) = text.split_once("knit-swaps").unwrap_or((&text, ""));
                    os_id = os_release_field(release, "ID");
                    os_version = os_release_field(release, "VERSION_ID");
                    let pretty = os_release_field(release, "PRETTY_NAME");
                    if !pretty.is_empty() {
                        os_name = pretty;
                    }
                    swap = swaps.lines().any(|l| !l.trim().is_empty());
                }
                Ok((code, _)) => tracing::warn!(instance = id, code, "reading os-release failed"),
                Err(e) => {
                    tracing::warn!(instance = id, error = %e, "Cloud Assistant unavailable for facts")
                }
            }
        }
        let nics = &i.network_interfaces.network_interface;
        Ok(InstanceFacts {
            id: i.instance_id.clone(),
            name: i.instance_name.clone(),
            state: state_word(&i.status),
            ip: i.private_ip(),
            instance_type: i.instance_type.clone(),
            account_id,
            region_id: self.settings.region.clone(),
            zone_id: i.zone_id.clone(),
            vpc_id: i.vpc_attributes.vpc_id.clone(),
            v_switch_id: i.vpc_attributes.v_switch_id.clone(),
            security_groups,
            eni_count: nics.len().max(1) as u32,
            max_enis: limit.map(|l| l.eni_quantity as u32).unwrap_or(0),
            max_ips_per_eni: limit
                .map(|l| l.eni_private_ip_address_quantity as u32)
                .unwrap_or(0),
            ram_role,
            ipv6: nics.iter().any(|n| !n.ipv6_sets.ipv6_set.is_empty()),
            swap,
            os_id,
            os_version,
            os_name,
            tags: i.tags.map(),
            password_login: i.key_pair_name.is_empty(),
            data_disks: disks
                .iter()
                .map(|d| DiskFacts {
                    id: d.disk_id.clone(),
                    device: guest_device(&d.device),
                    size_bytes: d.size << 30,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ECS's error Codes (those the fake answers and those the fallback
    /// acts on) map to their kinds; the message and code stay ECS's.
    #[test]
    fn ecs_codes_map_to_kinds() {
        use ProviderErrorKind as K;
        let api = |status: u16, code: &str| EcsError::Api {
            action: "RunInstances".into(),
            status,
            code: code.into(),
            message: "m".into(),
            request_id: "r-1".into(),
        };
        let cases = [
            (400, "OperationDenied.NoStock", K::Capacity),
            (400, "Zone.NotOnSale", K::Capacity),
            (400, "InvalidInstanceType.NotSupported", K::Capacity),
            (400, "InvalidResourceType.NotSupported", K::Capacity),
            (400, "Throttling.User", K::Throttled),
            (400, "Throttling", K::Throttled),
            (404, "InvalidAccessKeyId.NotFound", K::Auth),
            (400, "SignatureDoesNotMatch", K::Auth),
            (403, "Forbidden.RAM", K::Auth),
            (400, "InvalidSecurityToken.Mismatch", K::Auth),
            (400, "MissingAuthorization", K::Auth),
            (404, "InvalidInstanceId.NotFound", K::NotFound),
            (404, "InvalidSnapshotId.NotFound", K::NotFound),
            (404, "InvalidInstanceType.NotFound", K::NotFound),
            (404, "InvalidAction.NotFound", K::Permanent),
            (500, "InternalError", K::Transient),
            (503, "ServiceUnavailable", K::Transient),
            (403, "IncorrectInstanceStatus", K::Transient),
            (403, "OperationDenied.NoStock", K::Capacity),
            (400, "InvalidSnapshotId.NotReady", K::Transient),
            (400, "InvalidParameter", K::Permanent),
            (400, "QuotaExceed.ElasticQuota", K::Permanent),
            (400, "InvalidUserData.SizeExceeded", K::Permanent),
        ];
        for (status, code, kind) in cases {
            let e = api(status, code);
            let text = format!("provider ecs: {e} [{code}]");
            match err(e) {
                ServerError::Provider(p) => {
                    assert_eq!((p.kind, p.code.as_str()), (kind, code), "{status} {code}");
                    assert_eq!(p.to_string(), text);
                }
                other => panic!("not a provider error: {other}"),
            }
        }
        let transport = EcsError::Transport {
            action: "DescribeInstances".into(),
            endpoint: "https://ecs".into(),
            reason: "connection refused".into(),
        };
        assert_eq!(kind_of(&transport), K::Transient);
        assert_eq!(kind_of(&EcsError::Credentials("none".into())), K::Auth);
        assert_eq!(kind_of(&EcsError::Invalid("bad".into())), K::Permanent);
        assert_eq!(kind_of(&EcsError::Timeout("slow".into())), K::Transient);
    }

    #[test]
    fn tokens_are_stable_and_fit() {
        let a = client_token("run", &["workers-abcde"]);
        assert_eq!(a, client_token("run", &["workers-abcde"]));
        assert_ne!(a, client_token("run", &["workers-abcdf"]));
        assert!(a.len() <= 64 && a.is_ascii());
    }

    #[test]
    fn names_devices_and_rules() {
        assert_eq!(ecs_snapshot_name("build-1"), "build-1");
        assert_eq!(ecs_snapshot_name("0a1b"), "knit-0a1b");
        assert_eq!(ecs_snapshot_name("auto-x"), "knit-auto-x");
        assert_eq!(guest_device("/dev/xvdb").as_deref(), Some("vdb"));
        assert_eq!(guest_device("").as_deref(), None);
        let r = rule(&knit_ecs::api::Permission {
            direction: "ingress".into(),
            ip_protocol: "TCP".into(),
            port_range: "6443/6443".into(),
            source_cidr_ip: "10.0.0.0/8".into(),
            policy: "Accept".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((r.protocol.as_str(), r.policy.as_str()), ("tcp", "accept"));
    }

    /// Paths, arguments and names a script must take as they are.
    const AWKWARD: &[&str] = &["it's", "a  b", "$HOME `x` $(y)", "l1\nl2", "'\\'", "*"];

    fn run_sh(script: &str, tmpdir: &std::path::Path) -> (i32, String) {
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .env("TMPDIR", tmpdir)
            .output()
            .unwrap();
        assert!(out.stderr.is_empty(), "{out:?}");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    #[test]
    fn read_chunk_script_reads_awkward_paths() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..CHUNK + 100).map(|i| (i % 251) as u8).collect();
        for name in AWKWARD {
            let path = dir.path().join(name.replace('/', "_"));
            std::fs::write(&path, &data).unwrap();
            let path = path.display().to_string();
            let mut got = Vec::new();
            for index in 0..2 {
                let s = render_script(
                    READ_CHUNK_SH,
                    &[
                        ("file", &path),
                        ("secs", "30"),
                        ("chunk", &CHUNK.to_string()),
                        ("index", &index.to_string()),
                    ],
                    &[],
                )
                .unwrap();
                let (code, out) = run_sh(&s, dir.path());
                assert_eq!(code, 0, "{name:?}");
                got.extend(B64.decode(out.trim()).unwrap());
            }
            assert_eq!(got, data, "{name:?}");
        }
        let s = render_script(
            READ_CHUNK_SH,
            &[
                ("file", "/nonexistent/x"),
                ("secs", "1"),
                ("chunk", "1"),
                ("index", "0"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            run_sh(&s, dir.path()),
            (3, "not a readable regular file\n".into())
        );
    }

    #[test]
    fn exec_script_passes_arguments_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let mut argv = vec!["printf", "%s|"];
        argv.extend(AWKWARD);
        let s = render_script(
            EXEC_SH,
            &[("secs", "30"), ("inline", &INLINE_OUTPUT.to_string())],
            &argv,
        )
        .unwrap();
        let (code, out) = run_sh(&s, dir.path());
        assert_eq!(code, 0);
        let mut lines = out.lines();
        let head: Vec<&str> = lines.next().unwrap().splitn(5, ' ').collect();
        assert_eq!(head[..2], ["knit-exec", "0"], "{out}");
        let stdout = B64.decode(lines.next().unwrap()).unwrap();
        assert_eq!(
            String::from_utf8(stdout).unwrap(),
            format!("{}|", AWKWARD.join("|"))
        );
        // Inline output: its directory is gone.
        assert!(!std::path::Path::new(head[4]).exists());
        assert!(head[4].starts_with(&dir.path().display().to_string()));
    }

    #[test]
    fn remove_dir_script_removes_only_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let keep = dir.path().join("keep");
        std::fs::create_dir(&keep).unwrap();
        for name in AWKWARD {
            let target = dir.path().join(name.replace('/', "_"));
            std::fs::create_dir_all(target.join("sub")).unwrap();
            let s = render_script(
                REMOVE_DIR_SH,
                &[("dir", &target.display().to_string())],
                &[],
            )
            .unwrap();
            assert_eq!(run_sh(&s, dir.path()), (0, String::new()));
            assert!(!target.exists(), "{name:?}");
            assert!(keep.exists(), "{name:?}");
        }
    }

    #[test]
    fn facts_and_hostname_scripts_parse() {
        let hostname =
            knit_api::shell::guest_hostname("it's $x", None, knit_api::shell::LiveHostname::Try)
                .unwrap();
        for s in [FACTS_SH, hostname.as_str()] {
            let out = std::process::Command::new("/bin/sh")
                .args(["-n", "-c", s])
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        }
    }
}
