//! Shell scripts knit sends into machines or runs: each lives in a `.sh`
//! file beside the code that uses it (checked by shellcheck with the rest of
//! the repository's scripts) and gets its values as single-quoted
//! assignments put before its text, never spliced into it, so that no value
//! is ever read as shell.

use thiserror::Error;

/// A value that cannot go into a script.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("shell value {name}: {rule}")]
pub struct ShellError {
    /// The variable's name, or `argument N` for a positional one.
    pub name: String,
    pub rule: &'static str,
}

/// `value` as one single-quoted sh word: a `'` inside closes the quotes,
/// is escaped and reopens them.
pub fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// `script` with `name='value'` lines (and `set -- 'arg' …` when `args` is
/// not empty) put before its text, after its `#!` line when it has one.
/// Refused: a name that is not a shell variable name, a NUL in a value (a
/// shell variable cannot hold one).
pub fn render(script: &str, values: &[(&str, &str)], args: &[&str]) -> Result<String, ShellError> {
    let mut head = String::new();
    for (name, value) in values {
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(ShellError {
                name: name.to_string(),
                rule: "must be a shell variable name (a letter or _, then letters, digits, _)",
            });
        }
        no_nul(name, value)?;
        head.push_str(&format!("{name}={}\n", quote(value)));
    }
    if !args.is_empty() {
        head.push_str("set --");
        for (i, a) in args.iter().enumerate() {
            no_nul(&format!("argument {}", i + 1), a)?;
            head.push(' ');
            head.push_str(&quote(a));
        }
        head.push('\n');
    }
    Ok(
        match script.strip_prefix("#!").and(script.split_once('\n')) {
            Some((shebang, body)) => format!("{shebang}\n{head}{body}"),
            None => format!("{head}{script}"),
        },
    )
}

fn no_nul(name: &str, value: &str) -> Result<(), ShellError> {
    if value.contains('\0') {
        return Err(ShellError {
            name: name.to_string(),
            rule: "must not contain NUL",
        });
    }
    Ok(())
}

/// The one routine that changes a guest's host name, on every provider.
const GUEST_HOSTNAME: &str = include_str!("scripts/guest-hostname.sh");

/// How [`guest_hostname`] sets the running host name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveHostname {
    /// hostnamectl, else hostname; failing fails the script.
    Required,
    /// The same; failing is a warning on stderr (the name in /etc/hostname
    /// applies at the next start).
    Try,
    /// Left to the caller (the local cloud calls sethostname itself).
    Skip,
}

/// The `/etc/hosts` line of the guest to rewrite: `ip<TAB>old` becomes
/// `ip<TAB>name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostsEntry<'a> {
    pub ip: &'a str,
    pub old: &'a str,
}

/// The guest-hostname script for `name`, run by the guest's own `sh`:
/// writes `/etc/hostname`, the `/etc/hosts` entry when given, and sets the
/// running name as `live` says.
pub fn guest_hostname(
    name: &str,
    hosts: Option<HostsEntry<'_>>,
    live: LiveHostname,
) -> Result<String, ShellError> {
    guest_hostname_under("", name, hosts, live)
}

/// [`guest_hostname`] with `/etc` under `root` (tests).
fn guest_hostname_under(
    root: &str,
    name: &str,
    hosts: Option<HostsEntry<'_>>,
    live: LiveHostname,
) -> Result<String, ShellError> {
    let live = match live {
        LiveHostname::Required => "required",
        LiveHostname::Try => "try",
        LiveHostname::Skip => "skip",
    };
    let (ip, old) = hosts.map(|h| (h.ip, h.old)).unwrap_or(("", ""));
    render(
        GUEST_HOSTNAME,
        &[
            ("name", name),
            ("live", live),
            ("ip", ip),
            ("old", old),
            ("root", root),
        ],
        &[],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// Values a script must take as they are.
    const AWKWARD: &[&str] = &[
        "it's",
        "two  spaces",
        "$HOME and $(echo no) and `echo no`",
        "line one\nline two\n",
        "'",
        "''\\'",
        "",
        "* ? [a] ~ ; & | < > # !",
        "tab\there",
    ];

    /// A scratch directory removed when dropped (on failure and panic too).
    struct Scratch(PathBuf);
    impl Scratch {
        fn new(tag: &str) -> Scratch {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "knit-api-shell-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).expect("scratch directory");
            Scratch(p)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn sh(script: &str, path: Option<&Path>) -> std::process::Output {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(script);
        if let Some(p) = path {
            c.env("PATH", p);
        }
        c.output().expect("sh runs")
    }

    #[test]
    fn quote_escapes_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn rendered_values_and_arguments_arrive_unchanged() {
        for v in AWKWARD {
            let script = "#!/bin/sh\nprintf '%s|' \"$value\" \"$#\" \"$@\"\n";
            let out = render(script, &[("value", v)], &[v, "b c", v]).unwrap();
            assert!(out.starts_with("#!/bin/sh\nvalue="), "{out}");
            let run = sh(&out, None);
            assert!(run.status.success(), "{v:?}: {run:?}");
            assert_eq!(
                String::from_utf8_lossy(&run.stdout),
                format!("{v}|3|{v}|b c|{v}|"),
                "{v:?}"
            );
        }
        // No #! line: the assignments come first.
        let out = render("echo \"$a\"\n", &[("a", "x")], &[]).unwrap();
        assert_eq!(out, "a='x'\necho \"$a\"\n");
    }

    #[test]
    fn render_refuses_bad_names_and_nul() {
        for bad in ["", "1a", "a-b", "a b", "a=b", "$a"] {
            let e = render("true\n", &[(bad, "v")], &[]).unwrap_err();
            assert_eq!(e.name, bad);
        }
        let e = render("true\n", &[("v", "a\0b")], &[]).unwrap_err();
        assert_eq!(e.to_string(), "shell value v: must not contain NUL");
        let e = render("true\n", &[], &["ok", "a\0"]).unwrap_err();
        assert_eq!(e.name, "argument 2");
    }

    /// A /etc with a hosts file and a PATH of stand-ins for hostname and
    /// hostnamectl that record their arguments (never the host's own: the
    /// tests run as root).
    fn guest(hostnamectl_ok: Option<bool>, hostname_ok: bool) -> Scratch {
        let s = Scratch::new("hostname");
        std::fs::create_dir_all(s.0.join("etc")).unwrap();
        std::fs::create_dir_all(s.0.join("bin")).unwrap();
        std::fs::write(
            s.0.join("etc/hosts"),
            "127.0.0.1\tlocalhost\n10.0.0.5\told-name\n10.0.0.6\tother\n",
        )
        .unwrap();
        let stub = |tool: &str, ok: bool| {
            let p = s.0.join("bin").join(tool);
            let log = s.0.join(format!("{tool}.log"));
            std::fs::write(
                &p,
                format!(
                    "#!/bin/sh\nprintf '%s\\n' \"$*\" >> {}\nexit {}\n",
                    quote(&log.display().to_string()),
                    if ok { 0 } else { 1 }
                ),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        if let Some(ok) = hostnamectl_ok {
            stub("hostnamectl", ok);
        }
        stub("hostname", hostname_ok);
        s
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(p).unwrap_or_default()
    }

    #[test]
    fn guest_hostname_writes_the_files_with_awkward_names() {
        for name in AWKWARD
            .iter()
            .filter(|n| !n.is_empty() && !n.contains('\n'))
        {
            let g = guest(None, true);
            let root = g.0.display().to_string();
            let hosts = HostsEntry {
                ip: "10.0.0.5",
                old: "old-name",
            };
            let script =
                guest_hostname_under(&root, name, Some(hosts), LiveHostname::Skip).unwrap();
            let run = sh(&script, Some(&g.0.join("bin")));
            assert!(run.status.success(), "{name:?}: {run:?}");
            assert_eq!(read(g.0.join("etc/hostname")), format!("{name}\n"));
            assert_eq!(
                read(g.0.join("etc/hosts")),
                format!("127.0.0.1\tlocalhost\n10.0.0.6\tother\n10.0.0.5\t{name}\n")
            );
            // skip: neither tool ran.
            assert_eq!(read(g.0.join("hostname.log")), "");
        }
    }

    #[test]
    fn guest_hostname_without_hosts_entry_leaves_hosts_alone() {
        let g = guest(None, true);
        let root = g.0.display().to_string();
        let before = read(g.0.join("etc/hosts"));
        let script = guest_hostname_under(&root, "n-1", None, LiveHostname::Required).unwrap();
        let run = sh(&script, Some(&g.0.join("bin")));
        assert!(run.status.success(), "{run:?}");
        assert_eq!(read(g.0.join("etc/hosts")), before);
        assert_eq!(read(g.0.join("etc/hostname")), "n-1\n");
        assert_eq!(read(g.0.join("hostname.log")), "n-1\n");
    }

    #[test]
    fn guest_hostname_live_modes() {
        let name = "it's a $name";
        let run = |g: &Scratch, live| {
            let root = g.0.display().to_string();
            let script = guest_hostname_under(&root, name, None, live).unwrap();
            sh(&script, Some(&g.0.join("bin")))
        };
        // hostnamectl that works: hostname is not needed.
        let g = guest(Some(true), true);
        assert!(run(&g, LiveHostname::Try).status.success());
        assert_eq!(
            read(g.0.join("hostnamectl.log")),
            format!("set-hostname {name}\n")
        );
        assert_eq!(read(g.0.join("hostname.log")), "");
        // hostnamectl failing: hostname instead.
        let g = guest(Some(false), true);
        assert!(run(&g, LiveHostname::Required).status.success());
        assert_eq!(read(g.0.join("hostname.log")), format!("{name}\n"));
        // Both failing: an error when required, a warning when tried.
        let g = guest(Some(false), false);
        assert!(!run(&g, LiveHostname::Required).status.success());
        let g = guest(Some(false), false);
        let tried = run(&g, LiveHostname::Try);
        assert!(tried.status.success(), "{tried:?}");
        assert!(String::from_utf8_lossy(&tried.stderr).contains("at the next start"));
        assert_eq!(read(g.0.join("etc/hostname")), format!("{name}\n"));
    }

    #[test]
    fn guest_hostname_refuses_an_unwritable_etc() {
        let g = guest(None, true);
        let root = g.0.join("missing").display().to_string();
        let script = guest_hostname_under(&root, "n", None, LiveHostname::Try).unwrap();
        let run = sh(&script, Some(&g.0.join("bin")));
        assert!(!run.status.success());
        assert_eq!(read(g.0.join("hostname.log")), "");
    }

    #[test]
    fn guest_hostname_script_parses() {
        let script = guest_hostname("n", None, LiveHostname::Try).unwrap();
        let out = Command::new("sh")
            .args(["-n", "-c", &script])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
}
