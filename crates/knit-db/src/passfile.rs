//! `passfile=PATH` in a postgres:// URL: the password read from a file in
//! libpq's password-file format instead of from the URL, so it is never in
//! a command line, an environment or a log. Lines are
//! `hostname:port:database:username:password`; `*` matches anything in
//! the first four fields, `\:` and `\\` stand for `:` and `\`, lines
//! starting with `#` are comments, and the first matching line wins. As
//! libpq does, a file group or others may read is not used; here it is
//! refused with the rule rather than silently skipped.

use std::path::{Path, PathBuf};

/// Largest password file read.
const MAX_BYTES: u64 = 64 * 1024;

/// Takes `passfile` out of a URL's query: the URL without it (what the
/// driver parses) and the path, if any.
pub fn take(url: &str) -> Result<(String, Option<PathBuf>), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), None));
    };
    let mut path = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("passfile", value)) => {
                let decoded = percent_encoding::percent_decode_str(value)
                    .decode_utf8()
                    .map_err(|_| "passfile: not UTF-8 once percent-decoded".to_string())?;
                if decoded.is_empty() {
                    return Err("passfile: must name a file (passfile=/etc/knit/pgpass)".into());
                }
                path = Some(PathBuf::from(decoded.as_ref()));
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, path))
}

/// What a password is looked up for.
pub struct Target<'a> {
    pub host: &'a str,
    pub port: u16,
    pub database: &'a str,
    pub user: &'a str,
}

/// The password of the first line of `path` matching `target`.
pub fn lookup(path: &Path, target: &Target<'_>) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("passfile={shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("passfile={shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("passfile={shown}: not a regular file"));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "passfile={shown}: mode {mode:04o} lets group or others read it; a password file must be readable by its owner only (chmod 600 {shown})"
        ));
    }
    let mut text = String::new();
    file.take(MAX_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("passfile={shown}: {e}"))?;
    if text.len() as u64 > MAX_BYTES {
        return Err(format!("passfile={shown}: larger than {MAX_BYTES} bytes"));
    }
    let wanted = [
        target.host.to_string(),
        target.port.to_string(),
        target.database.to_string(),
        target.user.to_string(),
    ];
    for line in text.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split(line);
        if fields.len() != 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(&wanted)
            .all(|(f, w)| f == "*" || f == w)
        {
            return Ok(fields[4].clone());
        }
    }
    Err(format!(
        "passfile={shown}: no line for host {}, port {}, database {}, user {} (lines are hostname:port:database:username:password; * matches any)",
        target.host, target.port, target.database, target.user
    ))
}

/// A line's fields, `\:` and `\\` unescaped.
fn split(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(next), Some(f)) = (chars.next(), fields.last_mut()) {
                    f.push(next);
                }
            }
            // The password is the rest of the line, colons and all.
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(f) = fields.last_mut() {
                    f.push(c);
                }
            }
        }
    }
    fields
}

/// The password `passfile` gives for the connection `config` describes.
#[cfg(feature = "postgres")]
pub fn password_for(path: &Path, config: &tokio_postgres::Config) -> Result<String, String> {
    use tokio_postgres::config::Host;
    if config.get_password().is_some() {
        return Err(format!(
            "passfile={}: the URL holds a password too; give it in one place (the file)",
            path.display()
        ));
    }
    let user = config.get_user().ok_or_else(|| {
        format!(
            "passfile={}: the URL must name the user (postgres://USER@host/db) to find its line",
            path.display()
        )
    })?;
    // libpq's rule: a Unix socket is looked up as `localhost`.
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.as_str(),
        _ => "localhost",
    };
    let target = Target {
        host,
        port: config.get_ports().first().copied().unwrap_or(5432),
        database: config.get_dbname().unwrap_or(user),
        user,
    };
    lookup(path, &target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(format!("pgpass-{mode:o}"));
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    const T: Target<'static> = Target {
        host: "127.0.0.1",
        port: 5433,
        database: "knit",
        user: "knit",
    };

    #[test]
    fn passfile_is_taken_out_of_the_url() {
        assert_eq!(
            take("postgres://knit@h:5432/knit?sslmode=disable&passfile=%2Fetc%2Fknit%2Fpg&x=1")
                .unwrap(),
            (
                "postgres://knit@h:5432/knit?sslmode=disable&x=1".to_string(),
                Some(PathBuf::from("/etc/knit/pg"))
            )
        );
        assert_eq!(
            take("postgres://knit@h/knit?passfile=/p").unwrap(),
            (
                "postgres://knit@h/knit".to_string(),
                Some(PathBuf::from("/p"))
            )
        );
        assert_eq!(
            take("postgres://knit@h/knit").unwrap(),
            ("postgres://knit@h/knit".to_string(), None)
        );
        assert!(take("postgres://h/k?passfile=")
            .unwrap_err()
            .contains("must name a file"));
    }

    #[test]
    fn the_first_matching_line_gives_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(
            dir.path(),
            "# comment\n127.0.0.1:5432:knit:knit:wrong-port\nother:*:*:*:wrong-host\n*:5433:knit:knit:p\\:a\\\\ss:word\n*:*:*:*:fallback\n",
            0o600,
        );
        assert_eq!(lookup(&path, &T).unwrap(), "p:a\\ss:word");
        let other = Target { user: "admin", ..T };
        assert_eq!(lookup(&path, &other).unwrap(), "fallback");
        let path = file(dir.path(), "x:1:y:z:p\n", 0o400);
        let e = lookup(&path, &T).unwrap_err();
        assert!(
            e.contains("no line for host 127.0.0.1, port 5433, database knit, user knit"),
            "{e}"
        );
    }

    #[test]
    fn a_passfile_others_can_read_is_refused_naming_the_rule() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), "*:*:*:*:secret\n", 0o640);
        let e = lookup(&path, &T).unwrap_err();
        assert!(e.contains("mode 0640") && e.contains("chmod 600"), "{e}");
        assert!(!e.contains("secret"), "{e}");
        let e = lookup(&dir.path().join("absent"), &T).unwrap_err();
        assert!(e.starts_with("passfile="), "{e}");
    }
}
