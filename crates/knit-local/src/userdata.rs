//! The user-data runner, cloud-init compatible: a `#!` script, a
//! `#cloud-config`, or MIME multipart whose parts run in order. Shell parts
//! run as scripts; cloud-config parts are applied by the real cloud-init
//! (`cloud-init single` per module, see [`CLOUD_CONFIG_MODULES`]); any other
//! part, or a cloud-config with keys outside that table, is not run and is
//! reported as such (never as succeeded). Output is appended to
//! `/var/log/cloud-init-output.log`, ending with a status line as cloud-init's
//! final message, and a result record is written to
//! `/run/cloud-init/result.json`, as cloud-init does.

use base64::Engine;
use serde::Serialize;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

pub const OUTPUT_LOG: &str = "/var/log/cloud-init-output.log";
pub const RESULT: &str = "/run/cloud-init/result.json";
pub const PATH_ENV: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub filename: String,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// Splits user data into parts the way cloud-init's user-data handler does
/// for the forms knit supports.
pub fn parse(data: &[u8]) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    parse_into(data, &mut parts)?;
    Ok(parts)
}

fn parse_into(data: &[u8], parts: &mut Vec<Part>) -> Result<(), String> {
    let text = String::from_utf8_lossy(data);
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Ok(());
    }
    if trimmed.starts_with("#!") {
        parts.push(part(parts.len(), None, "text/x-shellscript", data.to_vec()));
        return Ok(());
    }
    if trimmed.starts_with("#cloud-config") {
        parts.push(part(parts.len(), None, "text/cloud-config", data.to_vec()));
        return Ok(());
    }
    let (headers, body) = split_headers(&text)
        .ok_or("user data is neither a #! script, #cloud-config, nor MIME (no header block)")?;
    let ctype =
        header(&headers, "content-type").ok_or("MIME user data has no Content-Type header")?;
    if !ctype.to_ascii_lowercase().starts_with("multipart/") {
        return Err(format!(
            "top-level MIME Content-Type {ctype:?} is not multipart/*"
        ));
    }
    let boundary = param(&ctype, "boundary")
        .ok_or_else(|| format!("Content-Type {ctype:?} has no boundary parameter"))?;
    let delim = format!("--{boundary}");
    let mut sections: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    for line in body.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\r', '\n']);
        if bare == delim || bare == format!("{delim}--") {
            if let Some(s) = current.take() {
                sections.push(s);
            }
            if bare.ends_with("--") && bare != delim {
                break;
            }
            current = Some(String::new());
        } else if let Some(s) = current.as_mut() {
            s.push_str(line);
        }
    }
    for section in sections {
        // The line break before a boundary belongs to the boundary.
        let section = section
            .strip_suffix('\n')
            .map(|s| s.strip_suffix('\r').unwrap_or(s))
            .unwrap_or(&section);
        let (h, b) = split_headers(section).unwrap_or((Vec::new(), section.to_string()));
        let ct = header(&h, "content-type").unwrap_or_else(|| "text/plain".into());
        let mut bytes = b.into_bytes();
        if header(&h, "content-transfer-encoding").is_some_and(|e| e.eq_ignore_ascii_case("base64"))
        {
            let clean: Vec<u8> = bytes
                .iter()
                .copied()
                .filter(|c| !c.is_ascii_whitespace())
                .collect();
            bytes = base64::engine::general_purpose::STANDARD
                .decode(clean)
                .map_err(|e| format!("part {}: bad base64: {e}", parts.len() + 1))?;
        }
        let mime = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if mime.starts_with("multipart/") {
            let mut nested = format!("Content-Type: {ct}\n\n").into_bytes();
            nested.extend(bytes);
            parse_into(&nested, parts)?;
            continue;
        }
        let filename = header(&h, "content-disposition").and_then(|d| param(&d, "filename"));
        parts.push(part(parts.len(), filename, &mime, bytes));
    }
    Ok(())
}

fn part(index: usize, filename: Option<String>, ctype: &str, body: Vec<u8>) -> Part {
    // Names become file names under scripts/: keep them plain.
    let filename = filename
        .filter(|f| {
            !f.is_empty()
                && f.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                && !f.starts_with('.')
        })
        .unwrap_or_else(|| format!("part-{:03}", index + 1));
    Part {
        filename,
        content_type: ctype.to_string(),
        body,
    }
}

fn split_headers(text: &str) -> Option<(Vec<(String, String)>, String)> {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        offset += line.len();
        let bare = line.trim_end_matches(['\r', '\n']);
        if bare.is_empty() {
            return Some((headers, text[offset..].to_string()));
        }
        if bare.starts_with([' ', '\t']) {
            let last = headers.last_mut()?;
            last.1.push(' ');
            last.1.push_str(bare.trim());
        } else {
            let (k, v) = bare.split_once(':')?;
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    None
}

fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

fn param(value: &str, name: &str) -> Option<String> {
    value.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

/// The cloud-config keys knit's runner applies, each with the cloud-init
/// module that applies them, in the order cloud-init runs those modules
/// (init: bootcmd, write_files; config: runcmd; final: packages, deferred
/// files, then the runcmd script, as `scripts_user` does).
pub const CLOUD_CONFIG_MODULES: &[(&str, &[&str])] = &[
    ("bootcmd", &["bootcmd"]),
    ("write_files", &["write_files"]),
    ("runcmd", &["runcmd"]),
    (
        "package_update_upgrade_install",
        &[
            "packages",
            "package_update",
            "package_upgrade",
            "package_reboot_if_required",
            "apt_update",
            "apt_upgrade",
            "apt_reboot_if_required",
        ],
    ),
    ("write_files_deferred", &["write_files"]),
];
/// Keys that say how cloud-config parts merge, not what to apply.
const CLOUD_CONFIG_MERGE_KEYS: &[&str] = &["merge_how", "merge_type"];
const CLOUD_INIT: &str = "/usr/bin/cloud-init";

/// How a part ended.
pub mod status {
    pub const SUCCEEDED: &str = "succeeded";
    pub const FAILED: &str = "failed";
    /// Not run at all: a type or cloud-config keys this runner does not handle.
    pub const NOT_RUN: &str = "not-run";
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PartResult {
    filename: String,
    content_type: String,
    /// `succeeded`, `failed` or `not-run` (see [`status`]).
    status: &'static str,
    /// None: not run, or could not start.
    exit_code: Option<i32>,
    error: Option<String>,
    /// cloud-config: the cloud-init modules run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    modules: Vec<String>,
    started_at: f64,
    duration_ms: u64,
}

impl PartResult {
    fn new(p: &Part) -> PartResult {
        PartResult {
            filename: p.filename.clone(),
            content_type: p.content_type.clone(),
            status: status::FAILED,
            exit_code: None,
            error: None,
            modules: Vec::new(),
            started_at: epoch(),
            duration_ms: 0,
        }
    }

    fn not_run(p: &Part, why: String) -> PartResult {
        let mut r = PartResult::new(p);
        r.status = status::NOT_RUN;
        r.error = Some(format!("not run: {why}"));
        r
    }

    /// Sets the status from the exit code.
    fn finish(mut self, clock: Instant) -> PartResult {
        self.status = if self.exit_code == Some(0) && self.error.is_none() {
            status::SUCCEEDED
        } else {
            status::FAILED
        };
        self.duration_ms = clock.elapsed().as_millis() as u64;
        self
    }
}

/// Seconds since the epoch with a fraction, as cloud-init's records keep
/// times.
fn epoch() -> f64 {
    knit_os::time::now_ms() as f64 / 1000.0
}

/// Runs the user data of instance `id` once per instance (cloud-init's
/// per-instance semaphore); returns the process exit code for PID 1's log.
pub fn run_knit(id: &str, user_data: &[u8]) -> i32 {
    let started = epoch();
    let clock = Instant::now();
    let sem = format!("/var/lib/cloud/instances/{id}/sem/config_scripts_user");
    let mut results = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut failed_part: Option<String> = None;
    let log = open_log();
    if Path::new(&sem).exists() {
        skipped
            .push("scripts already ran for this instance (per-instance semaphore present)".into());
    } else {
        match parse(user_data) {
            Err(e) => errors.push(format!("cannot parse user data: {e}")),
            Ok(parts) => {
                let dir = format!("/var/lib/cloud/instances/{id}/scripts");
                let mut by_part: Vec<Option<PartResult>> = parts.iter().map(|_| None).collect();
                let mut runcmds: Vec<(usize, std::path::PathBuf, Instant)> = Vec::new();
                for i in in_cloud_init_order(&parts) {
                    let p = &parts[i];
                    let r = match p.content_type.as_str() {
                        "text/x-shellscript" => run_part(&dir, p, log.as_ref(), &[]),
                        "text/cloud-boothook" => run_part(
                            &dir,
                            &boothook_script(p),
                            log.as_ref(),
                            &[("INSTANCE_ID", id)],
                        ),
                        "text/cloud-config" => {
                            let (r, runcmd) = run_cloud_config(&dir, p, log.as_ref());
                            if let Some(script) = runcmd {
                                // After every script, as scripts_user runs it.
                                runcmds.push((i, script, Instant::now()));
                                by_part[i] = Some(r);
                                continue;
                            }
                            r
                        }
                        other => PartResult::not_run(
                            p,
                            format!(
                                "knit's user-data runner does not handle {other} (it runs \
                                 text/x-shellscript, text/cloud-boothook and text/cloud-config; \
                                 userDataRunner: cloud-init handles every type)"
                            ),
                        ),
                    };
                    by_part[i] = Some(r);
                }
                for (i, script, clock) in runcmds {
                    if let Some(r) = by_part[i].take() {
                        by_part[i] = Some(run_runcmd(r, &script, log.as_ref(), clock));
                    }
                }
                for (p, r) in parts.iter().zip(by_part) {
                    let Some(r) = r else { continue };
                    if r.status != status::SUCCEEDED {
                        let why = r.error.clone().unwrap_or_else(|| {
                            format!("exited with {}", r.exit_code.unwrap_or(-1))
                        });
                        errors.push(format!("{}: {why}", p.filename));
                        failed_part.get_or_insert(p.filename.clone());
                    }
                    if r.status == status::NOT_RUN {
                        skipped.push(format!(
                            "{} ({}): {}",
                            p.filename,
                            p.content_type,
                            r.error.clone().unwrap_or_default()
                        ));
                    }
                    results.push(r);
                }
            }
        }
        let _ = std::fs::create_dir_all(format!("/var/lib/cloud/instances/{id}/sem"));
        let _ = std::fs::write(&sem, format!("{started}\n"));
    }
    let result = serde_json::json!({
        "v1": { "datasource": "DataSourceKnitLocal", "errors": errors },
        "knit": {
            "instanceId": id,
            "parts": results,
            "skipped": skipped,
            "failedPart": failed_part,
            "startedAt": started,
            "finishedAt": epoch(),
            "durationMs": clock.elapsed().as_millis() as u64,
        }
    });
    let text = knit_api::ser::value_pretty(&result);
    for path in ["/var/lib/cloud/data/result.json", RESULT] {
        write_atomic(path, &text);
    }
    if let Some(mut l) = log.as_ref() {
        let count = |want: &str| results.iter().filter(|r| r.status == want).count();
        let _ = writeln!(
            l,
            "{}",
            final_message(
                epoch(),
                &uptime(),
                count(status::SUCCEEDED),
                count(status::FAILED),
                count(status::NOT_RUN),
            )
        );
    }
    let _ = std::fs::write(
        format!("/var/lib/cloud/instances/{id}/boot-finished"),
        format!("{}\n", epoch()),
    );
    if errors.is_empty() {
        0
    } else {
        1
    }
}

/// Debian's cloud-init with the NoCloud datasource seeded from our metadata.
/// Every stage runs even if an earlier one reports a failed module, as under
/// systemd; cloud-init writes its own output log and result.json, so its
/// console output goes to the instance's console (PID 1's stderr).
pub fn run_cloud_init(id: &str, hostname: &str, user_data: &[u8]) -> i32 {
    let seed = "/var/lib/cloud/seed/nocloud";
    let _ = std::fs::create_dir_all(seed);
    let _ = std::fs::write(format!("{seed}/user-data"), user_data);
    let _ = std::fs::write(
        format!("{seed}/meta-data"),
        format!("instance-id: {id}\nlocal-hostname: {hostname}\n"),
    );
    let mut worst = 0;
    for stage in [
        &["init", "--local"][..],
        &["init"],
        &["modules", "--mode=config"],
        &["modules", "--mode=final"],
    ] {
        let code = script_command("/usr/bin/cloud-init", None)
            .args(stage)
            .status()
            .map(|s| s.code().unwrap_or(128))
            .unwrap_or(127);
        worst = worst.max(code);
    }
    worst
}

fn open_log() -> Option<std::fs::File> {
    let _ = std::fs::create_dir_all("/var/log");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(OUTPUT_LOG)
        .ok()
}

fn script_command(program: &str, log: Option<&std::fs::File>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", PATH_ENV)
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8")
        .current_dir("/")
        .stdin(Stdio::null());
    if let Some(f) = log.and_then(|f| f.try_clone().ok()) {
        if let Ok(g) = f.try_clone() {
            cmd.stdout(f).stderr(g);
        }
    }
    cmd
}

/// The order cloud-init gives the parts (stable within a kind): boothooks
/// in its init stage, then the cloud-config modules (bootcmd, write_files,
/// packages: init, config and the final stage before `scripts_user`), then
/// the scripts, then — in [`run_knit`] — each `runcmd` script, which
/// `scripts_user` runs after the part scripts. So a `runcmd` in
/// pre-user-data runs after knit's initialization on every runner; work that
/// must come first belongs in `bootcmd`.
pub fn in_cloud_init_order(parts: &[Part]) -> Vec<usize> {
    let stage = |p: &Part| match p.content_type.as_str() {
        "text/cloud-boothook" => 0,
        "text/cloud-config" => 1,
        _ => 2,
    };
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| stage(&parts[i]));
    order
}

/// A boothook as cloud-init's handler writes it: without its
/// `#cloud-boothook` line, so the rest must be an executable (a `#!`
/// script), run with `INSTANCE_ID` set.
fn boothook_script(p: &Part) -> Part {
    let prefix = b"#cloud-boothook";
    let body = match p.body.strip_prefix(prefix) {
        Some(rest) => rest
            .strip_prefix(b"\r\n")
            .or_else(|| rest.strip_prefix(b"\n"))
            .unwrap_or(rest),
        None => &p.body,
    };
    Part {
        body: body.to_vec(),
        ..p.clone()
    }
}

/// A script part run with `env` added, as cloud-init's handlers do.
fn run_part(dir: &str, p: &Part, log: Option<&std::fs::File>, env: &[(&str, &str)]) -> PartResult {
    let clock = Instant::now();
    let path = format!("{dir}/{}", p.filename);
    let mut r = PartResult::new(p);
    if let Err(e) = write_private(dir, &path, &p.body, 0o700) {
        r.error = Some(format!("cannot write {path}: {e}"));
        return r.finish(clock);
    }
    if let Some(mut l) = log {
        let _ = writeln!(l, "knit-local: running {path}");
    }
    let (code, error) = run_logged_env(&path, &[], log, env);
    r.exit_code = code;
    r.error = error;
    r.finish(clock)
}

fn write_private(dir: &str, path: &str, body: &[u8], mode: u32) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(mode)
        .open(path)?;
    f.write_all(body)
}

/// Runs a program with its output appended to the log: (exit code, error).
fn run_logged(
    program: &str,
    args: &[&str],
    log: Option<&std::fs::File>,
) -> (Option<i32>, Option<String>) {
    run_logged_env(program, args, log, &[])
}

fn run_logged_env(
    program: &str,
    args: &[&str],
    log: Option<&std::fs::File>,
    env: &[(&str, &str)],
) -> (Option<i32>, Option<String>) {
    let mut cmd = script_command(program, log);
    cmd.envs(env.iter().copied());
    match cmd.args(args).status() {
        Ok(s) => {
            (
                Some(s.code().unwrap_or(
                    128 + std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(0),
                )),
                None,
            )
        }
        Err(e) => (None, Some(format!("cannot execute {program}: {e}"))),
    }
}

/// The top-level keys of a cloud-config document, or why it is not one.
pub fn cloud_config_keys(body: &[u8]) -> Result<Vec<String>, String> {
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_slice(body).map_err(|e| format!("not valid YAML: {e}"))?;
    match value {
        serde_yaml_ng::Value::Null => Ok(Vec::new()),
        serde_yaml_ng::Value::Mapping(m) => m
            .keys()
            .map(|k| match k {
                serde_yaml_ng::Value::String(s) => Ok(s.clone()),
                other => knit_api::ser::yaml("a cloud-config key", other)
                    .map(|text| text.trim().to_string())
                    .map_err(|e| e.to_string()),
            })
            .collect(),
        _ => Err("a cloud-config must be a mapping of keys".to_string()),
    }
}

/// True when a `write_files` entry has `defer: true`.
pub fn has_deferred_files(body: &[u8]) -> bool {
    serde_yaml_ng::from_slice::<serde_yaml_ng::Value>(body).is_ok_and(|v| {
        v.get("write_files")
            .and_then(|w| w.as_sequence())
            .is_some_and(|files| {
                files
                    .iter()
                    .any(|f| f.get("defer").and_then(|d| d.as_bool()) == Some(true))
            })
    })
}

/// The cloud-init modules a cloud-config with these keys needs, in order,
/// or the keys this runner does not apply.
pub fn cloud_config_plan(keys: &[String]) -> Result<Vec<&'static str>, Vec<String>> {
    let unknown: Vec<String> = keys
        .iter()
        .filter(|k| {
            !CLOUD_CONFIG_MERGE_KEYS.contains(&k.as_str())
                && !CLOUD_CONFIG_MODULES
                    .iter()
                    .any(|(_, ks)| ks.contains(&k.as_str()))
        })
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(unknown);
    }
    Ok(CLOUD_CONFIG_MODULES
        .iter()
        .filter(|(_, ks)| ks.iter().any(|k| keys.iter().any(|have| have == k)))
        .map(|(module, _)| *module)
        .collect())
}

/// A `text/cloud-config` part, applied by the real cloud-init: the document
/// is checked with `cloud-init schema`, then each needed module runs with
/// `cloud-init --file <part> single --name <module> --frequency always`
/// (no datasource needed), and the script `runcmd` generated is run.
///
/// Returns the `runcmd` script the part wrote, kept under the part's name
/// for [`run_runcmd`] to run after every script (the result is finished
/// there).
fn run_cloud_config(
    dir: &str,
    p: &Part,
    log: Option<&std::fs::File>,
) -> (PartResult, Option<std::path::PathBuf>) {
    let clock = Instant::now();
    let mut r = PartResult::new(p);
    let keys = match cloud_config_keys(&p.body) {
        Ok(keys) => keys,
        Err(e) => {
            r.error = Some(e);
            return (r.finish(clock), None);
        }
    };
    let modules = match cloud_config_plan(&keys) {
        // write_files_deferred has work only for entries with `defer: true`.
        Ok(m) if !has_deferred_files(&p.body) => m
            .into_iter()
            .filter(|m| *m != "write_files_deferred")
            .collect(),
        Ok(m) => m,
        Err(unknown) => {
            let known: Vec<&str> = CLOUD_CONFIG_MODULES
                .iter()
                .flat_map(|(_, ks)| ks.iter().copied())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            return (
                PartResult::not_run(
                    p,
                    format!(
                        "cloud-config keys {} are not applied by knit's user-data runner (it applies {}); \
                         nothing of this part was applied (userDataRunner: cloud-init applies every module)",
                        unknown.join(", "),
                        known.join(", ")
                    ),
                ),
                None,
            );
        }
    };
    if !Path::new(CLOUD_INIT).exists() {
        return (
            PartResult::not_run(
                p,
                format!("{CLOUD_INIT} is not installed in this image (package cloud-init)"),
            ),
            None,
        );
    }
    let path = format!("{dir}/{}.cloud-config", p.filename);
    if let Err(e) = write_private(dir, &path, &p.body, 0o600) {
        r.error = Some(format!("cannot write {path}: {e}"));
        return (r.finish(clock), None);
    }
    if let Some(mut l) = log {
        let _ = writeln!(
            l,
            "knit-local: applying {} with cloud-init modules {}",
            p.filename,
            modules.join(", ")
        );
    }
    let (code, error) = run_logged(CLOUD_INIT, &["schema", "--config-file", &path], log);
    if code != Some(0) {
        r.exit_code = code;
        r.error = Some(error.unwrap_or_else(|| {
            format!("invalid cloud-config (cloud-init schema; see {OUTPUT_LOG})")
        }));
        return (r.finish(clock), None);
    }
    // runcmd writes its script under the (datasource-less) instance's
    // scripts directory; an old one must not be mistaken for this part's.
    if modules.contains(&"runcmd") {
        for old in runcmd_scripts() {
            let _ = std::fs::remove_file(old);
        }
    }
    for module in &modules {
        r.modules.push(module.to_string());
        let (code, error) = run_logged(
            CLOUD_INIT,
            &[
                "--file",
                &path,
                "single",
                "--name",
                module,
                "--frequency",
                "always",
            ],
            log,
        );
        if code != Some(0) {
            r.exit_code = code;
            r.error = Some(error.unwrap_or_else(|| {
                format!(
                    "cloud-init module {module} failed (exit {}); see /var/log/cloud-init.log",
                    code.unwrap_or(-1)
                )
            }));
            return (r.finish(clock), None);
        }
    }
    if modules.contains(&"runcmd") {
        let Some(script) = runcmd_scripts().into_iter().next() else {
            r.error = Some("cloud-init's runcmd module wrote no script".to_string());
            return (r.finish(clock), None);
        };
        // The next part's runcmd module writes the same path: keep this one.
        let kept = std::path::PathBuf::from(format!("{dir}/{}.runcmd", p.filename));
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::rename(&script, &kept))
        {
            r.error = Some(format!("cannot keep {}: {e}", script.display()));
            return (r.finish(clock), None);
        }
        return (r, Some(kept));
    }
    r.exit_code = Some(0);
    (r.finish(clock), None)
}

/// Runs a cloud-config part's `runcmd` script after every script part, and
/// finishes that part's result with it.
fn run_runcmd(
    mut r: PartResult,
    script: &Path,
    log: Option<&std::fs::File>,
    clock: Instant,
) -> PartResult {
    if let Some(mut l) = log {
        let _ = writeln!(l, "knit-local: running {}", script.display());
    }
    let (code, error) = run_logged(&script.to_string_lossy(), &[], log);
    r.exit_code = code;
    r.error = error.or_else(|| {
        (code != Some(0)).then(|| format!("runcmd exited with {}", code.unwrap_or(-1)))
    });
    r.finish(clock)
}

/// `runcmd` scripts cloud-init wrote, newest first.
fn runcmd_scripts() -> Vec<std::path::PathBuf> {
    let mut found: Vec<(std::time::SystemTime, std::path::PathBuf)> =
        std::fs::read_dir("/var/lib/cloud/instances")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("scripts/runcmd"))
            .filter_map(|p| {
                let modified = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
                Some((modified, p))
            })
            .collect();
    found.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    found.into_iter().map(|(_, p)| p).collect()
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// The last line of the output log, shaped like cloud-init's final message
/// (`Cloud-init v. … finished at … Datasource …  Up N seconds`).
pub fn final_message(
    at: f64,
    uptime: &str,
    succeeded: usize,
    failed: usize,
    not_run: usize,
) -> String {
    format!(
        "knit-local user-data runner v. {} finished at {}. Datasource DataSourceKnitLocal.  Up {uptime} seconds. Parts: {succeeded} succeeded, {failed} failed, {not_run} not run",
        env!("CARGO_PKG_VERSION"),
        knit_os::time::rfc2822(knit_os::time::from_ms((at * 1000.0) as i64))
    )
}

/// Best effort, as cloud-init's own status files: a result that cannot be
/// written leaves the old one (or none), never a torn one.
fn write_atomic(path: &str, text: &str) {
    let path = Path::new(path);
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = crate::state::write_durable_with_mode(path, text.as_bytes(), 0o644);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Boothooks, then cloud-config modules, then scripts, each kind in
    /// its parts' order (the runcmd scripts come after all of them).
    #[test]
    fn parts_run_in_cloud_init_stage_order() {
        let p = |ct: &str| Part {
            filename: String::new(),
            content_type: ct.into(),
            body: Vec::new(),
        };
        let parts = [
            p("text/x-shellscript"),
            p("text/cloud-config"),
            p("text/cloud-boothook"),
            p("text/x-shellscript"),
            p("text/cloud-config"),
        ];
        assert_eq!(in_cloud_init_order(&parts), [2, 1, 4, 0, 3]);
        let hook = Part {
            body: b"#cloud-boothook\n#!/bin/sh\necho hi\n".to_vec(),
            ..p("text/cloud-boothook")
        };
        assert_eq!(boothook_script(&hook).body, b"#!/bin/sh\necho hi\n");
    }

    #[test]
    fn single_script() {
        let p = parse(b"#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].content_type, "text/x-shellscript");
        assert_eq!(p[0].filename, "part-001");
    }

    #[test]
    fn multipart_in_order_with_base64_nested_and_config() {
        let doc = "Content-Type: multipart/mixed; boundary=\"XX\"\r\nMIME-Version: 1.0\r\n\r\n\
--XX\r\nContent-Type: text/cloud-config\r\n\r\n#cloud-config\nruncmd: []\r\n\
--XX\r\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\r\nContent-Disposition: attachment; filename=\"first.sh\"\r\n\r\n#!/bin/sh\necho one\r\n\
--XX\r\nContent-Type: text/x-shellscript\r\nContent-Transfer-Encoding: base64\r\n\r\nIyEvYmluL3NoCmVjaG8gdHdvCg==\r\n\
--XX\r\nContent-Type: multipart/mixed; boundary=YY\r\n\r\n--YY\nContent-Type: text/x-shellscript\n\n#!/bin/sh\necho three\n--YY--\n\r\n\
--XX--\r\n";
        let p = parse(doc.as_bytes()).unwrap();
        let names: Vec<_> = p
            .iter()
            .map(|p| (p.filename.as_str(), p.content_type.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("part-001", "text/cloud-config"),
                ("first.sh", "text/x-shellscript"),
                ("part-003", "text/x-shellscript"),
                ("part-004", "text/x-shellscript"),
            ]
        );
        assert_eq!(p[1].body, b"#!/bin/sh\necho one");
        assert_eq!(p[2].body, b"#!/bin/sh\necho two\n");
        assert_eq!(p[3].body, b"#!/bin/sh\necho three");
    }

    #[test]
    fn cloud_config_keys_map_to_modules_in_cloud_init_order() {
        let keys = cloud_config_keys(b"#cloud-config\nruncmd: [ls]\nwrite_files: []\n").unwrap();
        assert_eq!(
            cloud_config_plan(&keys).unwrap(),
            ["write_files", "runcmd", "write_files_deferred"]
        );
        let keys = cloud_config_keys(b"#cloud-config\nusers: []\nruncmd: [ls]\n").unwrap();
        assert_eq!(cloud_config_plan(&keys).unwrap_err(), ["users"]);
        assert!(cloud_config_keys(b"#cloud-config\n- a\n").is_err());
        assert!(!has_deferred_files(
            b"#cloud-config\nwrite_files: [{path: /a}]\n"
        ));
        assert!(has_deferred_files(
            b"#cloud-config\nwrite_files: [{path: /a, defer: true}]\n"
        ));
        assert!(
            cloud_config_plan(&cloud_config_keys(b"#cloud-config\n").unwrap())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn final_message_has_cloud_init_shape() {
        let later = final_message(1_796_088_201.75, "1", 0, 0, 0);
        assert!(
            later.contains(" finished at Tue, 01 Dec 2026 01:23:21 +0000. "),
            "{later}"
        );
        let line = final_message(0.0, "12.5", 2, 1, 1);
        assert!(
            line.starts_with("knit-local user-data runner v. "),
            "{line}"
        );
        assert!(line.contains(" finished at Thu, 01 Jan 1970 00:00:00 +0000. Datasource DataSourceKnitLocal.  Up 12.5 seconds."), "{line}");
        assert!(
            line.ends_with("Parts: 2 succeeded, 1 failed, 1 not run"),
            "{line}"
        );
    }

    #[test]
    fn garbage_is_an_error_and_unsafe_names_are_replaced() {
        assert!(parse(b"hello world").is_err());
        assert!(parse(b"Content-Type: text/plain\n\nx")
            .unwrap_err()
            .contains("not multipart"));
        let doc = "Content-Type: multipart/mixed; boundary=B\n\n--B\nContent-Type: text/x-shellscript\nContent-Disposition: attachment; filename=\"../../etc/passwd\"\n\n#!/bin/sh\n--B--\n";
        assert_eq!(parse(doc.as_bytes()).unwrap()[0].filename, "part-001");
        assert!(parse(b"").unwrap().is_empty());
    }
}
