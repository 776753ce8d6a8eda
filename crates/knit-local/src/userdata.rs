//! The user-data runner: cloud-init compatible for scripts. A `#!` script, or
//! MIME multipart whose `text/x-shellscript` parts run in order; output is
//! appended to `/var/log/cloud-init-output.log` and a result record is
//! written to `/run/cloud-init/result.json`, as cloud-init does.

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

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PartResult {
    filename: String,
    content_type: String,
    /// None: not run (unsupported type) or could not start.
    exit_code: Option<i32>,
    error: Option<String>,
    started_at: f64,
    duration_ms: u64,
}

fn epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
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
                for p in parts {
                    if p.content_type != "text/x-shellscript" {
                        skipped.push(format!(
                            "{} ({}): only cloud-init handles this type",
                            p.filename, p.content_type
                        ));
                        continue;
                    }
                    let r = run_part(&dir, &p, log.as_ref());
                    if r.exit_code != Some(0) {
                        let why = r.error.clone().unwrap_or_else(|| {
                            format!("exited with {}", r.exit_code.unwrap_or(-1))
                        });
                        errors.push(format!("{}: {why}", p.filename));
                        failed_part.get_or_insert(p.filename.clone());
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
    let text = serde_json::to_string_pretty(&result).unwrap_or_default();
    for path in ["/var/lib/cloud/data/result.json", RESULT] {
        write_atomic(path, &text);
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

fn run_part(dir: &str, p: &Part, log: Option<&std::fs::File>) -> PartResult {
    let started_at = epoch();
    let clock = Instant::now();
    let path = format!("{dir}/{}", p.filename);
    let mut r = PartResult {
        filename: p.filename.clone(),
        content_type: p.content_type.clone(),
        exit_code: None,
        error: None,
        started_at,
        duration_ms: 0,
    };
    let written = std::fs::create_dir_all(dir).and_then(|_| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o700)
            .open(&path)?;
        f.write_all(&p.body)
    });
    if let Err(e) = written {
        r.error = Some(format!("cannot write {path}: {e}"));
        return r;
    }
    if let Some(mut l) = log {
        let _ = writeln!(l, "knit-local: running {path}");
    }
    match script_command(&path, log).status() {
        Ok(s) => {
            r.exit_code =
                Some(s.code().unwrap_or(
                    128 + std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(0),
                ));
        }
        Err(e) => r.error = Some(format!("cannot execute {path}: {e}")),
    }
    r.duration_ms = clock.elapsed().as_millis() as u64;
    r
}

fn write_atomic(path: &str, text: &str) {
    if let Some(dir) = Path::new(path).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = format!("{path}.tmp");
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
