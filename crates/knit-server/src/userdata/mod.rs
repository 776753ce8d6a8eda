//! User-data composition (docs/spec.md §1.1): a cloud-init compatible MIME
//! multipart of (1) the pool's pre-user-data, (2) knit's stub that fetches
//! and runs the agent, (3) the pool's user-data. Pure functions: same input,
//! same bytes.

use crate::error::{Result, ServerError};
use base64::Engine;
use knit_api::USER_DATA_LIMIT_BYTES;
use sha2::{Digest, Sha256};

pub mod agent;

/// Where the agent keeps what the stub fetched, inside the instance.
pub use knit_api::agent::BOOTSTRAP_DIR;

/// What the knit stub needs to know.
#[derive(Debug, Clone)]
pub struct StubParams<'a> {
    /// Package mirror base URL (`<base>/bin/knit-agent` is fetched).
    pub mirror_url: &'a str,
    /// Hex sha256 of the mirror's `knit-agent`.
    pub agent_sha256: &'a str,
    /// Full URL of the bootstrap endpoint.
    pub bootstrap_url: &'a str,
    /// One-time token exchanged for the NodeConfig.
    pub join_token: &'a str,
    /// The control plane's CA (PEM), trusted by curl for both URLs.
    pub ca_pem: &'a str,
}

/// The stub's text; the values go in as assignments after its first line.
const STUB: &str = include_str!("stub.sh");

/// The knit initialization script (part 2): [`STUB`] with its values
/// assigned at the top, each shell-quoted, so that no value is ever read
/// as shell (a value no shell word can hold, a NUL, is refused).
pub fn agent_stub(p: &StubParams<'_>) -> crate::error::Result<String> {
    let (shebang, body) = STUB.split_once('\n').unwrap_or(("#!/bin/bash", STUB));
    let values = [
        ("dir", BOOTSTRAP_DIR),
        ("mirror", p.mirror_url.trim_end_matches('/')),
        ("agent_sha256", p.agent_sha256),
        ("bootstrap_url", p.bootstrap_url),
        ("join_token", p.join_token),
        ("ca_pem", p.ca_pem.trim_end()),
    ];
    let mut out = format!("{shebang}\n");
    for (name, value) in values {
        out.push_str(&format!("{name}={}\n", knit_os::quote::quote(value)?));
    }
    out.push_str(body);
    Ok(out)
}

/// One part of the multipart document.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Part {
    filename: &'static str,
    /// The whole Content-Type value: a nested multipart keeps its boundary.
    content_type: String,
    body: String,
}

/// The first-line prefixes cloud-init's user-data processor recognises
/// (`INCLUSION_TYPES_MAP` in cloudinit/handlers), longest first where one
/// is a prefix of another. Anything else with no `#!` is a bare script.
const STARTS_WITH: &[(&str, &str)] = &[
    ("#cloud-config-archive", "text/cloud-config-archive"),
    ("#cloud-config-jsonp", "text/cloud-config-jsonp"),
    ("#cloud-config", "text/cloud-config"),
    ("#cloud-boothook", "text/cloud-boothook"),
    ("#include-once", "text/x-include-once-url"),
    ("#include", "text/x-include-url"),
    ("#part-handler", "text/part-handler"),
    ("#upstart-job", "text/upstart-job"),
    ("## template: jinja", "text/jinja2"),
    ("#!", "text/x-shellscript"),
];

/// User data that is itself MIME multipart (a header block whose
/// Content-Type is `multipart/*` with a boundary): its Content-Type value
/// and the body after its headers.
fn mime_multipart(text: &str) -> Option<(String, String)> {
    let mut content_type: Option<String> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        offset += line.len();
        let bare = line.trim_end_matches(['\r', '\n']);
        if bare.is_empty() {
            let ct = content_type?;
            let lower = ct.to_ascii_lowercase();
            return (lower.starts_with("multipart/") && lower.contains("boundary="))
                .then(|| (ct, text[offset..].to_string()));
        }
        if bare.starts_with([' ', '\t']) {
            // A folded header line continues the previous one.
            if let Some(ct) = content_type.as_mut() {
                ct.push(' ');
                ct.push_str(bare.trim());
            }
            continue;
        }
        let (name, value) = bare.split_once(':')?;
        if name.trim().eq_ignore_ascii_case("content-type") {
            content_type = Some(value.trim().to_string());
        } else if name.contains(' ') {
            return None;
        }
    }
    None
}

/// A script as cloud-init will run it: each form cloud-init recognises by
/// its first line keeps its type (`#cloud-config`, `#cloud-boothook`,
/// `#include`, a `#!` script, …), MIME multipart user data is nested whole
/// (cloud-init and knit's runner walk into it, its parts in their order),
/// and anything else gets `#!/bin/bash`.
fn part(filename: &'static str, script: &str) -> Option<Part> {
    if script.trim().is_empty() {
        return None;
    }
    let (content_type, body) = if let Some((ct, body)) = mime_multipart(script) {
        (ct, body)
    } else if let Some((_, ct)) = STARTS_WITH.iter().find(|(p, _)| script.starts_with(p)) {
        (ct.to_string(), script.to_string())
    } else {
        (
            "text/x-shellscript".to_string(),
            format!("#!/bin/bash\n{script}"),
        )
    };
    let body = if body.ends_with('\n') {
        body
    } else {
        format!("{body}\n")
    };
    Some(Part {
        filename,
        content_type,
        body,
    })
}

/// Composes the instance's user data; refuses a result over the provider's
/// 32 KB limit with the size of each part.
pub fn compose(pre_user_data: &str, stub: &str, user_data: &str) -> Result<String> {
    let parts: Vec<Part> = [
        part("01-pre-user-data", pre_user_data),
        part("02-knit-init", stub),
        part("03-user-data", user_data),
    ]
    .into_iter()
    .flatten()
    .collect();

    let mut hasher = Sha256::new();
    for p in &parts {
        hasher.update(p.body.as_bytes());
    }
    let digest = hex::encode(hasher.finalize());
    // The boundary must not occur in any part; derive it from the content
    // and lengthen it in the (pathological) case it does.
    let mut boundary = format!("==knit-{}==", &digest[..24]);
    let mut extra = 24;
    while parts.iter().any(|p| p.body.contains(&boundary)) && extra < digest.len() {
        extra += 8;
        boundary = format!("==knit-{}==", &digest[..extra]);
    }

    let mut out = String::new();
    out.push_str(&format!(
        "Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n"
    ));
    for p in &parts {
        // The line break before a boundary belongs to the delimiter (RFC
        // 2046), so one more keeps each script's own final newline.
        out.push_str(&format!("\n--{boundary}\n"));
        if p.content_type
            .to_ascii_lowercase()
            .starts_with("multipart/")
        {
            // A multipart is never base64-encoded (RFC 2046 5.1): its own
            // parts carry their encodings.
            let encoding = if p.body.is_ascii() { "7bit" } else { "8bit" };
            out.push_str(&format!("Content-Type: {}\n", p.content_type));
            out.push_str(&format!(
                "MIME-Version: 1.0\nContent-Transfer-Encoding: {encoding}\n\n"
            ));
            out.push_str(&p.body);
        } else if p.body.is_ascii() {
            out.push_str(&format!(
                "Content-Type: {}; charset=\"us-ascii\"\n",
                p.content_type
            ));
            out.push_str("MIME-Version: 1.0\nContent-Transfer-Encoding: 7bit\n");
            out.push_str(&format!(
                "Content-Disposition: attachment; filename=\"{}\"\n\n",
                p.filename
            ));
            out.push_str(&p.body);
        } else {
            // 8-bit text is base64-encoded so every byte survives transport.
            out.push_str(&format!(
                "Content-Type: {}; charset=\"utf-8\"\n",
                p.content_type
            ));
            out.push_str("MIME-Version: 1.0\nContent-Transfer-Encoding: base64\n");
            out.push_str(&format!(
                "Content-Disposition: attachment; filename=\"{}\"\n\n",
                p.filename
            ));
            let encoded = base64::engine::general_purpose::STANDARD.encode(p.body.as_bytes());
            for line in encoded.as_bytes().chunks(76) {
                out.push_str(&String::from_utf8_lossy(line));
                out.push('\n');
            }
        }
    }
    out.push_str(&format!("\n--{boundary}--\n"));

    if out.len() > USER_DATA_LIMIT_BYTES {
        return Err(ServerError::UserDataTooLarge {
            size: out.len(),
            limit: USER_DATA_LIMIT_BYTES,
            pre: pre_user_data.len(),
            stub: stub.len(),
            user: user_data.len(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBfixedTESTcertificateBODYforGOLDENfilesONLY\n-----END CERTIFICATE-----\n";

    fn stub() -> String {
        agent_stub(&StubParams {
            mirror_url: "https://10.213.0.1:7443/mirror/",
            agent_sha256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            bootstrap_url: "https://10.213.0.1:7443/bootstrap/v1/config",
            join_token: "0123456789abcdef0123456789abcdef",
            ca_pem: CA,
        })
        .unwrap()
    }

    fn golden(name: &str, actual: &str) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        if std::env::var_os("KNIT_UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, actual).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run with KNIT_UPDATE_GOLDEN=1 to create)",
                path.display()
            )
        });
        assert_eq!(actual, expected, "output differs from {}", path.display());
    }

    /// Values with quotes, spaces, `$` and newlines reach the script as
    /// they are (bash reads back exactly each assigned value).
    #[test]
    fn stub_values_are_shell_quoted() {
        let tricky = "a'b \"c\" $(touch /tmp/knit-pwned) `x`\nline2";
        let stub = agent_stub(&StubParams {
            mirror_url: tricky,
            agent_sha256: "ab",
            bootstrap_url: "https://h/x",
            join_token: tricky,
            ca_pem: tricky,
        })
        .unwrap();
        let assignments: String = stub.split("set -euo pipefail").next().unwrap().to_string();
        let out = std::process::Command::new("/bin/bash")
            .arg("-c")
            .arg(format!(
                "{assignments}\nprintf '%s|%s|%s' \"$mirror\" \"$join_token\" \"$ca_pem\""
            ))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("{tricky}|{tricky}|{tricky}")
        );
        assert!(stub.contains("\ndir=/var/lib/knit/bootstrap\n"), "{stub}");
    }

    #[test]
    fn golden_three_parts() {
        let out = compose(
            "yum install -y htop\ntouch /var/.skip-yum",
            &stub(),
            "#!/bin/sh\necho hello",
        )
        .unwrap();
        golden("userdata-three-parts.txt", &out);
    }

    #[test]
    fn golden_stub_only() {
        let out = compose("", &stub(), "  \n").unwrap();
        golden("userdata-stub-only.txt", &out);
    }

    #[test]
    fn golden_utf8_and_cloud_config() {
        let out = compose(
            "#cloud-config\nruncmd:\n  - echo hi\n",
            &stub(),
            "echo 'héllo wörld ✓'",
        )
        .unwrap();
        golden("userdata-utf8-cloud-config.txt", &out);
    }

    #[test]
    fn shebang_is_added_only_when_missing() {
        let out = compose("echo pre", &stub(), "#!/usr/bin/env python3\nprint(1)").unwrap();
        assert!(out.contains("#!/bin/bash\necho pre\n"));
        assert!(out.contains("#!/usr/bin/env python3\nprint(1)\n"));
        assert!(!out.contains("#!/bin/bash\n#!/usr/bin/env python3"));
    }

    #[test]
    fn over_the_limit_is_refused_with_sizes() {
        let big = "x".repeat(USER_DATA_LIMIT_BYTES);
        let err = compose("", &stub(), &big).unwrap_err();
        assert_eq!(err.code(), "UserDataTooLarge");
        let text = err.to_string();
        assert!(
            text.contains(&format!("user-data {} bytes", big.len())),
            "{text}"
        );
        assert!(text.contains("limit of 32768 bytes"), "{text}");
    }

    #[test]
    fn boundary_never_occurs_in_a_part() {
        let s = stub();
        let first = compose("", &s, "echo").unwrap();
        let boundary = first
            .lines()
            .next()
            .unwrap()
            .split('"')
            .nth(1)
            .unwrap()
            .to_string();
        // A user-data that contains the boundary it would have been given.
        let tricky = format!("echo {boundary}");
        let out = compose("", &s, &tricky).unwrap();
        let new_boundary = out.lines().next().unwrap().split('"').nth(1).unwrap();
        assert!(!tricky.contains(new_boundary));
        assert_eq!(out.matches(&format!("\n--{new_boundary}\n")).count(), 2);
    }

    /// Runs the stub with a fake `curl` and `knit-agent` and a logging shim
    /// for every other program it runs: the join token must reach curl
    /// through a mode-0600 header file and appear in no process's argv.
    #[test]
    fn the_stub_never_puts_the_token_on_a_command_line() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let bin = root.join("bin");
        std::fs::create_dir(&bin).unwrap();
        let log = root.join("argv.log");
        let headers = root.join("headers.log");
        let agent = format!(
            "#!/bin/sh\nprintf '%s\\n' \"knit-agent $*\" >> {}\n",
            log.display()
        );
        let sha = hex::encode(Sha256::digest(agent.as_bytes()));
        let exe = |path: &std::path::Path, text: &str| {
            std::fs::write(path, text).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        std::fs::write(root.join("agent"), &agent).unwrap();
        // curl: logs its argv; `-H @file` logs the file's mode and text;
        // `-o` gets the agent or a NodeConfig.
        exe(
            &bin.join("curl"),
            &format!(
                r#"#!/bin/sh
printf '%s\n' "curl $*" >> {log}
out=; url=
while [ $# -gt 0 ]; do
    case "$1" in
        -o) out="$2"; shift;;
        -H) case "$2" in @*) f="${{2#@}}"; echo "mode $(stat -c %a "$f") $(cat "$f")" >> {headers};; esac; shift;;
        https://*) url="$1";;
    esac
    shift
done
case "$url" in
    */bin/knit-agent) cat {agent} > "$out";;
    *) echo "config" > "$out";;
esac
"#,
                log = log.display(),
                headers = headers.display(),
                agent = root.join("agent").display(),
            ),
        );
        for tool in ["mkdir", "chmod", "cat", "sha256sum", "mv", "rm"] {
            let real = std::process::Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .unwrap();
            let real = String::from_utf8(real.stdout).unwrap().trim().to_string();
            assert!(!real.is_empty(), "{tool} not found");
            exe(
                &bin.join(tool),
                &format!(
                    "#!/bin/sh\nprintf '%s\\n' \"{tool} $*\" >> {}\nexec {real} \"$@\"\n",
                    log.display()
                ),
            );
        }
        let token = "tok3n-0123456789abcdef0123456789";
        let stub = agent_stub(&StubParams {
            mirror_url: "https://10.219.1.1:7443/mirror",
            agent_sha256: &sha,
            bootstrap_url: "https://10.219.1.1:7443/bootstrap/v1/config",
            join_token: token,
            ca_pem: CA,
        })
        .unwrap();
        let dir = root.join("bootstrap");
        let stub = stub.replace(
            &format!("dir={BOOTSTRAP_DIR}"),
            &format!("dir={}", dir.display()),
        );
        assert!(stub.contains(&format!("dir={}", dir.display())));
        let out = std::process::Command::new("/bin/bash")
            .arg("-c")
            .arg(&stub)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let argv = std::fs::read_to_string(&log).unwrap();
        assert!(
            argv.contains("curl ") && argv.contains("knit-agent init"),
            "{argv}"
        );
        assert!(
            !argv.contains(token),
            "the token is on a command line:\n{argv}"
        );
        let sent = std::fs::read_to_string(&headers).unwrap();
        assert_eq!(
            sent.trim(),
            format!("mode 600 Authorization: Bearer {token}")
        );
        assert!(
            !dir.join("join-token.header").exists(),
            "the header file is removed after use"
        );
    }

    /// The parts of `user_data` as cloud-init's processor walks them with
    /// Python's `email` package: (type, filename, payload).
    fn python_parts(user_data: &str) -> Vec<serde_json::Value> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("user-data");
        std::fs::write(&file, user_data).unwrap();
        let script = r#"
import email, json, sys
raw = open(sys.argv[1], 'rb').read()
msg = email.message_from_string(raw.decode('utf-8'))
assert msg.is_multipart(), 'not multipart'
parts = []
for part in msg.walk():
    if part.get_content_maintype() == 'multipart':
        continue
    parts.append({'type': part.get_content_type(), 'filename': part.get_filename(),
                  'payload': part.get_payload(decode=True).decode('utf-8')})
print(json.dumps(parts))
"#;
        let output = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&file)
            .output()
            .expect("python3 is required (scripts/setup.sh installs it)");
        assert!(
            output.status.success(),
            "python3 failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// Issue 27 (4): a boothook, an `#include` and user data that is
    /// itself MIME multipart keep their types (before, each was wrapped in
    /// `#!/bin/bash` and broke); the nested document's parts come in its
    /// order, after knit's, as cloud-init walks them.
    #[test]
    fn every_form_cloud_init_takes_keeps_its_type() {
        let pre = "#cloud-boothook\necho early > /run/boothook-ran";
        let user = "MIME-Version: 1.0\nContent-Type: multipart/mixed;\n boundary=\"user-b\"\n\n\
                    --user-b\nContent-Type: text/x-shellscript\n\n#!/bin/sh\necho one\n\
                    --user-b\nContent-Type: text/x-include-url\n\n#include\nhttp://192.0.2.1/more\n\
                    --user-b--\n";
        let out = compose(pre, &stub(), user).unwrap();
        let parts = python_parts(&out);
        let types: Vec<&str> = parts.iter().map(|p| p["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "text/cloud-boothook",
                "text/x-shellscript",
                "text/x-shellscript",
                "text/x-include-url"
            ],
            "{out}"
        );
        assert_eq!(parts[0]["payload"], format!("{pre}\n"));
        assert_eq!(parts[2]["payload"], "#!/bin/sh\necho one");
        assert_eq!(parts[3]["payload"], "#include\nhttp://192.0.2.1/more");
        for (first_line, want) in [
            ("#include\nhttp://x/y", "text/x-include-url"),
            ("#include-once\nhttp://x/y", "text/x-include-once-url"),
            ("#cloud-config-archive\n- {}", "text/cloud-config-archive"),
            ("## template: jinja\n#!/bin/sh", "text/jinja2"),
        ] {
            assert_eq!(part("p", first_line).unwrap().content_type, want);
        }
    }

    /// Parses the composed document with Python's `email` package exactly as
    /// cloud-init's user-data processor walks it, and compares every part.
    #[test]
    fn python_email_parses_it_like_cloud_init() {
        let pre = "touch /var/.skip-yum";
        let user = "echo 'héllo' > /tmp/user-data-ran";
        let out = compose(pre, &stub(), user).unwrap();
        let parts = python_parts(&out);
        assert_eq!(parts.len(), 3);
        let expect = [
            ("01-pre-user-data", format!("#!/bin/bash\n{pre}\n")),
            ("02-knit-init", stub()),
            ("03-user-data", format!("#!/bin/bash\n{user}\n")),
        ];
        for (part, (filename, payload)) in parts.iter().zip(expect) {
            assert_eq!(part["type"], "text/x-shellscript");
            assert_eq!(part["filename"], filename);
            assert_eq!(part["payload"].as_str().unwrap(), payload);
        }
    }
}
