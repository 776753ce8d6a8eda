//! Manual mode: the machine keeps its OS. [`issue_script`] makes the
//! command to paste on it; the command redeems its attach token
//! ([`check_token`], then [`redeem`]) and, when its join fails, rolls the
//! machine back and says so ([`report_failure`]). A manual-mode machine
//! leaving its pool is put back as before the attach ([`undo_inside`]).

use super::{
    context, diagnose, enroll, field_error, fill_script, record, rename_target, undo, AttachRecord,
    AttachTokenOptions, ATTACH_SENTINEL, ATTACH_TOKEN_PREFIX, DEFAULT_EXPIRES_SECONDS,
    MAX_EXPIRES_SECONDS,
};
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::preflight::{self, Mode};
use crate::store::{now_ms, Redeem};
use crate::{pki, userdata};
use base64::Engine;
use knit_api::agent::LeaveReport;
use knit_api::state::{EventType, InstanceState};
use knit_api::views::{AttachScriptRequest, AttachScriptResponse, MachineFacts, PreflightReport};
use sha2::{Digest, Sha256};

/// `POST /api/v1/pools/{pool}/attach-script`: a single-use attach token
/// for the pool, its options kept, and the command that redeems it.
pub fn issue_script(
    cp: &ControlPlane,
    pool_name: &str,
    req: &AttachScriptRequest,
) -> Result<AttachScriptResponse> {
    let expires = req.expires_seconds.unwrap_or(DEFAULT_EXPIRES_SECONDS);
    if !(1..=MAX_EXPIRES_SECONDS).contains(&expires) {
        return Err(field_error(
            "expiresSeconds",
            expires.to_string(),
            "must be in [1, 604800] (one week)",
        ));
    }
    cp.store.live_pool(pool_name)?;
    let agent_sha256 = cp.mirror_sha256("bin/knit-agent")?.ok_or_else(|| {
        ServerError::Package(
            "the package mirror has no bin/knit-agent: run `knit package build`".into(),
        )
    })?;
    let token_id = pki::random_lower_alnum(6)?;
    let token = format!("{ATTACH_TOKEN_PREFIX}{token_id}{}", pki::random_hex(16)?);
    let expires_ms = now_ms() + expires * 1000;
    cp.store.put_attach_token_options(
        &token_id,
        &AttachTokenOptions {
            pool: pool_name.to_string(),
            keep_instance_name: req.keep_instance_name,
            format_data_disk: req.format_data_disk,
            expires_ms,
        },
    )?;
    cp.store.add_join_token(
        &pki::token_hash(&token),
        &token_id,
        ATTACH_SENTINEL,
        pool_name,
        expires * 1000,
    )?;
    let pin = ca_pin(&cp.ca_pem)?;
    let text = manual_script(&ManualScript {
        base_url: &cp.advertise_url,
        agent_sha256: &agent_sha256,
        token: &token,
        ca_pem: &cp.ca_pem,
        ca_pin: &pin,
    })?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
    let command = format!("echo {b64} | base64 -d | bash");
    cp.store.add_event(
        EventType::Normal,
        "NodePool",
        pool_name,
        "AttachScriptIssued",
        &format!("attach command with token {token_id} (single use, expires in {expires} s)"),
    )?;
    Ok(AttachScriptResponse {
        pool: pool_name.to_string(),
        token_id,
        expires_ms,
        ca_pin: pin,
        command,
        script: text,
    })
}

/// `sha256:<hex>` of the CA certificate (DER): what the command checks the
/// CA it carries against before trusting it.
pub fn ca_pin(ca_pem: &str) -> Result<String> {
    let certs = knit_os::pem::certificates(ca_pem.as_bytes(), "the control-plane CA")?;
    let der = &certs[0];
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(der.as_ref()))
    ))
}

struct ManualScript<'a> {
    base_url: &'a str,
    agent_sha256: &'a str,
    token: &'a str,
    ca_pem: &'a str,
    ca_pin: &'a str,
}

/// The script the pasted command runs on the machine (`manual.sh`).
const MANUAL_SCRIPT: &str = include_str!("manual.sh");
/// Where the agent writes why its `init` failed (read by the rollback).
const ERROR_MSG_FILE: &str = "/var/log/knit-deploy-error-msg.log";

/// [`MANUAL_SCRIPT`] with this control plane's values and the token.
fn manual_script(p: &ManualScript<'_>) -> Result<String> {
    fill_script(
        MANUAL_SCRIPT,
        &[
            ("BASE_URL", p.base_url),
            ("AGENT_SHA256", p.agent_sha256),
            ("CA_PIN", p.ca_pin.trim_start_matches("sha256:")),
            ("CA_PEM", p.ca_pem.trim_end()),
            ("BOOTSTRAP_DIR", userdata::BOOTSTRAP_DIR),
            ("STATE_DIR", knit_agent_state_dir()),
            ("ERROR_MSG_FILE", ERROR_MSG_FILE),
            ("TOKEN", p.token),
        ],
    )
}

/// The agent's state directory on a machine (`/var/lib/knit`): the command
/// removes it on failure when it was not there before.
fn knit_agent_state_dir() -> &'static str {
    userdata::BOOTSTRAP_DIR
        .strip_suffix("/bootstrap")
        .unwrap_or(userdata::BOOTSTRAP_DIR)
}

/// Refuses an attach command's call: counted, recorded as an event naming
/// the caller's address, answered as a refused token.
fn refuse<T>(cp: &ControlPlane, peer_ip: Option<&str>, why: String) -> Result<T> {
    cp.metrics.bootstrap_refused();
    cp.store.add_event(
        EventType::Warning,
        "NodePool",
        "-",
        "AttachRefused",
        &format!("{why} (from {})", peer_ip.unwrap_or("unknown")),
    )?;
    Err(ServerError::TokenRefused(why))
}

/// A live attach token, looked at and not spent yet.
pub struct Grant {
    pool: String,
    token_id: String,
    hash: String,
    options: AttachTokenOptions,
}

/// `POST /attach/v1/manual`, first half: the pasted command's attach token
/// (`token`, from its bearer header; empty when none) must be live.
/// Looked at, not spent: a machine refused by the preflight of [`redeem`]
/// keeps the command usable once the problem is fixed.
pub fn check_token(cp: &ControlPlane, token: &str, peer_ip: Option<&str>) -> Result<Grant> {
    let Some(rest) = token.strip_prefix(ATTACH_TOKEN_PREFIX) else {
        return refuse(cp, peer_ip, "not an attach token".into());
    };
    let token_id: String = rest.chars().take(6).collect();
    let now = now_ms();
    let hash = pki::token_hash(token);
    let pool = match cp.store.live_join_token(&hash, now)? {
        Some((instance, pool)) if instance == ATTACH_SENTINEL => pool,
        Some(_) => return refuse(cp, peer_ip, "unknown attach token".into()),
        // Not live: redeem only explains why (it changes nothing then).
        None => match cp.store.redeem_join_token(&hash, now)? {
            Redeem::Used { used_ms, .. } => {
                return refuse(cp, peer_ip, format!(
                    "attach token {token_id} already used {} s ago: one command adds one instance; make a new one with knit attach-script",
                    (now - used_ms) / 1000
                ))
            }
            Redeem::Expired { expires_ms, .. } => {
                return refuse(
                    cp,
                    peer_ip,
                    format!(
                        "attach token {token_id} expired {} s ago",
                        (now - expires_ms) / 1000
                    ),
                )
            }
            Redeem::Ok { .. } | Redeem::Unknown => {
                return refuse(cp, peer_ip, "unknown attach token".into())
            }
        },
    };
    let options = cp.store.attach_token_options(&token_id)?.ok_or_else(|| {
        ServerError::Internal(format!(
            "the options of attach token {token_id} are missing"
        ))
    })?;
    Ok(Grant {
        pool,
        token_id,
        hash,
        options,
    })
}

/// What became of a machine's attach: added (its one-time join token), or
/// refused by the server-side checks (answered 422 with `code`).
#[derive(Debug)]
pub enum Redeemed {
    Joined {
        join_token: String,
    },
    Refused {
        code: &'static str,
        message: String,
        preflight: Option<Vec<PreflightReport>>,
    },
}

/// `POST /attach/v1/manual`, second half: the machine calling from
/// `peer_ip` is found at the provider by its address, checked (its own view
/// `machine` wins for what the machine decides), and added to the grant's
/// pool; the token is spent then.
pub async fn redeem(
    cp: &ControlPlane,
    grant: Grant,
    peer_ip: Option<&str>,
    machine: MachineFacts,
) -> Result<Redeemed> {
    let Grant {
        pool: pool_name,
        token_id,
        hash,
        options,
    } = grant;
    let record = cp
        .store
        .pool(&pool_name)?
        .ok_or_else(|| ServerError::Conflict(format!("pool {pool_name} was removed")))?;
    let provider = cp.provider()?.clone();
    // The caller is identified by its address: the instance whose private
    // IP the request came from.
    let Some(ip) = peer_ip else {
        return refuse(cp, peer_ip, "the caller's address is unknown".into());
    };
    let Some(found) = provider
        .list()
        .await?
        .into_iter()
        .find(|i| i.ip.as_deref() == Some(ip))
    else {
        return Ok(Redeemed::Refused {
            code: "PreflightUnknownInstance",
            message: format!(
                "no instance of provider {} has the address {ip}",
                provider.name()
            ),
            preflight: None,
        });
    };
    let mut facts = provider.facts(&found.id).await?;
    // The machine's own view wins for what the machine itself decides.
    facts.swap = facts.swap || machine.swap;
    if !machine.os_id.is_empty() {
        facts.os_id = machine.os_id;
        facts.os_version = machine.os_version;
        facts.os_name = machine.os_name;
    }
    let cluster = cp.cluster_doc()?;
    let mut ctx = context(cp, Mode::Manual, 1, false, &facts.id)?;
    ctx.keep_instance_name = options.keep_instance_name;
    if let Some(a) = provider.account_id().await? {
        ctx.account_id = a;
    }
    let report = preflight::check(&cluster, &record.pool, &facts, &ctx);
    if !report.passed() {
        let text = knit_api::views::preflight_table(std::slice::from_ref(&report));
        cp.store.add_event(
            EventType::Warning,
            "NodePool",
            &pool_name,
            "AttachRefused",
            &format!("preflight failed for {}", facts.id),
        )?;
        return Ok(Redeemed::Refused {
            code: "PreflightFailed",
            message: format!("preflight failed for {}:\n{text}", facts.id),
            preflight: Some(vec![report]),
        });
    }
    // Spent now: of two machines racing with one command, one wins.
    if !matches!(
        cp.store.redeem_join_token(&hash, now_ms())?,
        Redeem::Ok { .. }
    ) {
        return refuse(
            cp,
            peer_ip,
            format!("attach token {token_id} was used meanwhile"),
        );
    }
    let name = format!("{pool_name}-{}", pki::random_lower_alnum(5)?);
    let rec = AttachRecord {
        instance: name.clone(),
        provider_id: facts.id.clone(),
        pool: pool_name.clone(),
        mode: Mode::Manual,
        instance_name: facts.name.clone(),
        keep_instance_name: options.keep_instance_name,
        format_data_disk: options.format_data_disk,
        old_disks: facts.data_disks.iter().map(|d| d.id.clone()).collect(),
        new_disks: facts.data_disks.iter().map(|d| d.id.clone()).collect(),
        at_ms: now_ms(),
        reimaged_ms: None,
        new_password: false,
    };
    enroll(
        cp,
        &pool_name,
        &name,
        &facts,
        InstanceState::Running,
        &rec,
        false,
    )
    .await?;
    // Not keeping its name: the instance takes its node name at once
    // (hostname included). A provider that cannot rename leaves the
    // instance's name as it was; the node still takes the pool's rule.
    if let Some(node_name) = rename_target(cp, &record.pool, &name)? {
        if let Err(e) = provider.rename(&facts.id, &node_name).await {
            cp.store.add_event(
                EventType::Warning,
                "Instance",
                &name,
                "RenameFailed",
                &format!(
                    "{} keeps its name {:?}: renaming it to its node name {node_name} failed: {e}",
                    facts.id, facts.name
                ),
            )?;
        }
    }
    let join_token = cp.issue_join_token(&name, &pool_name)?;
    cp.store.add_event(
        EventType::Normal,
        "Instance",
        &name,
        "Attached",
        &format!(
            "{} ({ip}) added by its attach command (manual mode, OS kept)",
            facts.id
        ),
    )?;
    cp.wake();
    Ok(Redeemed::Joined { join_token })
}

/// `POST /attach/v1/failed` (report token): the attach command says its
/// join failed and it rolled the machine back. The add is undone (instance
/// `Detached` with the reason, the pool's count back, its Node object
/// removed if it had registered); the answer is the diagnosis to print.
pub async fn report_failure(cp: &ControlPlane, token: &str, text: &str) -> Result<String> {
    let instance = cp
        .store
        .instance_by_report_token(&pki::token_hash(token))?
        .ok_or_else(|| ServerError::Unauthorized("unknown report token".into()))?;
    if !record(cp, &instance.name)?.is_some_and(|r| r.mode == Mode::Manual) {
        return Err(ServerError::Conflict(format!(
            "{} was not added by an attach command (manual mode): nothing to roll back",
            instance.name
        )));
    }
    let reason: String = text.trim().chars().take(2000).collect();
    let reason = if reason.is_empty() {
        "no reason given".to_string()
    } else {
        reason
    };
    // Its kubelet was stopped by the rollback: a Node it registered goes.
    for node in cp
        .store
        .nodes()?
        .into_iter()
        .filter(|n| n.instance == instance.name)
    {
        if let Err(e) = cp.cluster.remove_node(&node.name).await {
            tracing::warn!(node = %node.name, error = %e, "removing the Node of a rolled-back attach failed");
        }
    }
    let message = diagnose(
        cp,
        &instance.name,
        format!("the attach command failed on the machine: {reason}"),
    );
    undo(
        cp,
        &instance.name,
        &format!("{message}; the command rolled the machine back"),
    )
    .await?;
    Ok(format!(
        "{message}\nThe control plane recorded the failure: {} left pool {} and the pool's count is back.\n",
        instance.name, instance.pool
    ))
}

/// How long the undo inside a leaving machine may take (services are
/// stopped one by one, each with its own timeout inside the agent).
const UNDO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether an added instance keeps its own OS (manual mode): leaving its
/// pool, it is put back as before the attach and left running instead of
/// being stopped. `Err` says why that cannot be told.
pub fn added_manually(cp: &ControlPlane, instance: &str) -> std::result::Result<bool, String> {
    match record(cp, instance) {
        Ok(r) => Ok(r.is_some_and(|r| r.mode == Mode::Manual)),
        Err(e) => Err(format!("its attach record is unreadable: {e}")),
    }
}

/// What runs inside a manual-mode machine leaving its pool (`leave.sh`):
/// `knit-agent leave` (knit's services stopped, its mounts, kernel settings
/// and files undone from the ledger, then the agent, the CA and the
/// NodeConfig removed), or for an agent from before that subcommand its
/// `reset --undo` and the same removal.
const LEAVE_SCRIPT: &str = include_str!("leave.sh");

fn leave_script() -> Result<String> {
    fill_script(
        LEAVE_SCRIPT,
        &[
            ("BOOTSTRAP_DIR", userdata::BOOTSTRAP_DIR),
            ("AGENT", knit_api::agent::AGENT_EXE),
            ("STATE_DIR", knit_agent_state_dir()),
        ],
    )
}

/// Undoes knit's changes inside a running manual-mode instance through the
/// provider's exec. `Err` is the reason it could not (no exec, a failed or
/// partial undo, a timeout), for the event of the fallback.
pub(crate) async fn undo_inside(
    provider: &dyn crate::provider::Provider,
    id: &str,
) -> std::result::Result<(), String> {
    let script = leave_script().map_err(|e| e.to_string())?;
    let argv = vec!["/bin/sh".to_string(), "-c".to_string(), script];
    match tokio::time::timeout(UNDO_TIMEOUT, provider.exec(id, &argv)).await {
        Err(_) => Err(format!(
            "the undo did not finish within {} s",
            UNDO_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("cannot run the undo inside it: {e}")),
        Ok(Ok((0, _, _))) => Ok(()),
        Ok(Ok((code, stdout, stderr))) => {
            // `knit-agent leave` lists what it could not undo in its report;
            // else (an older agent, the script itself) its output says it.
            let text = match serde_json::from_slice::<LeaveReport>(&stdout) {
                Ok(report) if !report.failed.is_empty() => {
                    format!("not undone: {}", report.failed.join("; "))
                }
                _ => String::from_utf8_lossy(if stderr.is_empty() { &stdout } else { &stderr })
                    .trim()
                    .to_string(),
            };
            // The end says what was not undone; keep events short.
            let tail: String = {
                let chars: Vec<char> = text.chars().collect();
                chars[chars.len().saturating_sub(800)..].iter().collect()
            };
            Err(format!(
                "the undo inside it (knit-agent leave) exited with {code}: {tail}"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leave_script_is_valid_sh_and_calls_the_agent() {
        let s = leave_script().unwrap();
        for needle in [
            "dir='/var/lib/knit/bootstrap'",
            "agent='/var/lib/knit/bootstrap/knit-agent'",
            "state_dir='/var/lib/knit'",
            "exec \"$agent\" leave",
            "reset --undo",
        ] {
            assert!(s.contains(needle), "{needle} missing:\n{s}");
        }
        let out = std::process::Command::new("sh")
            .args(["-n", "-c", &s])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every command of the script that talks to the control plane reads
    /// its bearer token from a file: the token is only in the `bearer`
    /// builtin call (printf), never in a program's argv.
    #[test]
    fn the_manual_script_keeps_tokens_off_command_lines() {
        let token = "knitattach.abcdef0123456789";
        let s = manual_script(&ManualScript {
            base_url: "https://10.219.1.1:7443",
            agent_sha256: &"ab".repeat(32),
            token,
            ca_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            ca_pin: "sha256:00",
        })
        .unwrap();
        // Commands as the shell sees them: continuation lines joined.
        let joined = s.replace("\\\n", " ");
        let lines: Vec<&str> = joined.lines().map(str::trim).collect();
        let with_token: Vec<&&str> = lines.iter().filter(|l| l.contains(token)).collect();
        assert_eq!(with_token, vec![&&*format!("bearer '{token}'")]);
        assert!(lines.iter().any(|l| l.starts_with("bearer() { printf ")));
        let talkers: Vec<&&str> = lines
            .iter()
            .filter(|l| {
                !l.starts_with('#')
                    && (l.contains("curl ") || l.starts_with("fetch "))
                    && !l.starts_with("fetch() {")
            })
            .collect();
        assert!(talkers.len() >= 4, "{talkers:#?}");
        for l in talkers {
            assert!(!l.contains("Bearer"), "a token on a command line: {l}");
        }
        assert_eq!(
            lines.iter().filter(|l| l.contains("-H @\"$auth\"")).count(),
            3,
            "the attach, bootstrap and failure calls read the header file"
        );
    }

    /// The route of the API a concrete path is served by (`:x` one
    /// segment, `*x` the rest).
    fn route_of(path: &str) -> Option<knit_api::routes::Route> {
        let want: Vec<&str> = path.split('/').collect();
        knit_api::routes::Route::ALL.iter().copied().find(|r| {
            let have: Vec<&str> = r.path().split('/').collect();
            let mut i = 0;
            for seg in &have {
                if seg.starts_with('*') {
                    return want.len() > i && !want[i].is_empty();
                }
                match want.get(i) {
                    Some(w) if seg.starts_with(':') && !w.is_empty() => {}
                    Some(w) if w == seg => {}
                    _ => return false,
                }
                i += 1;
            }
            i == want.len()
        })
    }

    /// The script's URLs (`$base/...`) are routes of the API's one list
    /// (`knit_api::routes`): a renamed route fails here, naming the line.
    #[test]
    fn the_manual_script_calls_declared_routes() {
        use knit_api::routes::Route;
        let mut called = std::collections::BTreeSet::new();
        for (i, line) in MANUAL_SCRIPT.lines().enumerate() {
            for (at, _) in line.match_indices("$base/") {
                let path: String = line[at + "$base".len()..]
                    .chars()
                    .take_while(|c| !matches!(c, '"' | ' ' | '\'' | ')'))
                    .collect();
                let route = route_of(&path).unwrap_or_else(|| {
                    panic!(
                        "attach/manual.sh:{}: {path} is no route of knit_api::routes",
                        i + 1
                    )
                });
                called.insert(format!("{route:?}"));
            }
        }
        for route in [
            Route::Mirror,
            Route::AttachManual,
            Route::AttachFailed,
            Route::Bootstrap,
        ] {
            assert!(
                called.contains(&format!("{route:?}")),
                "{route:?} not called: {called:?}"
            );
        }
        assert_eq!(route_of("/api/v1/pools/p/scale"), Some(Route::ScalePool));
        assert_eq!(route_of("/attach/v1/manualx"), None);
        assert_eq!(route_of("/mirror/"), None);
    }

    #[test]
    fn the_manual_script_is_valid_bash_and_carries_pin_token_and_checksum() {
        let s = manual_script(&ManualScript {
            base_url: "https://10.213.0.1:7443",
            agent_sha256: &"ab".repeat(32),
            token: "knitattach.abcdef0123",
            ca_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            ca_pin: "sha256:00",
        })
        .unwrap();
        for needle in [
            "knitattach.abcdef0123",
            &"ab".repeat(32),
            "'00'",
            "/attach/v1/manual",
            "sha256sum -c",
            "/attach/v1/failed",
            "reset --undo",
            "trap cleanup EXIT",
        ] {
            assert!(s.contains(needle), "{needle} missing");
        }
        let out = std::process::Command::new("bash")
            .args(["-n", "-c", &s])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
