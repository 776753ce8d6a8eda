//! `knit server --config-file FILE`: every `knit server` flag from a YAML
//! file (`/etc/knit/server.yaml` in the Debian package), so that a systemd
//! unit runs one fixed command line. Keys are the flags' long names
//! (`state-dir: /var/lib/knit/server`). The file's flags are put before
//! the command line's, and a flag given twice keeps its last value: the
//! command line wins over the file, the file over the environment.

use super::server::ServerOpts;
use crate::error::{CliError, Result};
use clap::Args;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::Path;

/// Largest config file read: a few hundred bytes in practice.
const MAX_BYTES: u64 = 64 * 1024;

/// The long names of `knit server`'s flags, as a file may use them.
pub fn flag_names() -> Vec<String> {
    ServerOpts::augment_args(clap::Command::new("server"))
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect()
}

fn bad(path: &Path, message: String) -> CliError {
    CliError::Usage(format!("config file {}: {message}", path.display()))
}

/// The flags a config file holds, as command-line arguments.
pub fn file_args(path: &Path) -> Result<Vec<OsString>> {
    let file = std::fs::File::open(path).map_err(|e| bad(path, e.to_string()))?;
    let mut text = String::new();
    file.take(MAX_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| bad(path, e.to_string()))?;
    if text.len() as u64 > MAX_BYTES {
        return Err(bad(path, format!("larger than {MAX_BYTES} bytes")));
    }
    args_from_yaml(&text).map_err(|m| bad(path, m))
}

/// The flags a config document holds, each checked against `knit
/// server`'s flags: an unknown key or a value that is not one scalar is
/// refused naming the key.
pub fn args_from_yaml(text: &str) -> std::result::Result<Vec<OsString>, String> {
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let map = match doc {
        serde_yaml_ng::Value::Null => return Ok(Vec::new()),
        serde_yaml_ng::Value::Mapping(m) => m,
        _ => return Err("must be a mapping of flag names to values".to_string()),
    };
    let known = flag_names();
    let mut args = Vec::new();
    for (key, value) in map {
        let key = match key {
            serde_yaml_ng::Value::String(k) => k,
            other => return Err(format!("key {other:?} is not a flag name")),
        };
        if !known.contains(&key) {
            return Err(format!(
                "unknown key {key:?}: keys are `knit server` flags without the dashes ({})",
                known.join(", ")
            ));
        }
        let value = match value {
            serde_yaml_ng::Value::Null => continue,
            serde_yaml_ng::Value::String(s) => s,
            serde_yaml_ng::Value::Number(n) => n.to_string(),
            serde_yaml_ng::Value::Bool(b) => b.to_string(),
            _ => {
                return Err(format!(
                    "{key}: must be one value (a string or a number; several listen addresses are one string separated by commas)"
                ))
            }
        };
        args.push(OsString::from(format!("--{key}")));
        args.push(OsString::from(value));
    }
    Ok(args)
}

/// `argv` with `extra` put right after the subcommand `words` name
/// (`["server"]`, or `["server", "init"]` whose own flags they are),
/// skipping the global `--config VALUE` before them; `None` when `argv`
/// runs another command.
pub fn insert_after(
    argv: &[OsString],
    words: &[&str],
    extra: Vec<OsString>,
) -> Option<Vec<OsString>> {
    let (first, rest) = words.split_first()?;
    let mut i = 1;
    loop {
        let arg = argv.get(i)?.as_os_str();
        if arg == OsStr::new("--config") {
            i += 2;
        } else if arg.to_string_lossy().starts_with("--config=") {
            i += 1;
        } else if arg == OsStr::new(first) {
            break;
        } else {
            return None;
        }
    }
    for word in rest {
        i += 1 + argv[i + 1..]
            .iter()
            .position(|a| a.as_os_str() == OsStr::new(word))?;
    }
    let mut out = argv[..=i].to_vec();
    out.extend(extra);
    out.extend_from_slice(&argv[i + 1..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn keys_are_flags_and_values_scalars() {
        let args = args_from_yaml(
            "state-dir: /srv/knit\nparallelism: 8\nlisten: 127.0.0.1:7443,10.0.0.1:7443\nregion: ~\n",
        )
        .unwrap();
        assert_eq!(
            args,
            os(&[
                "--state-dir",
                "/srv/knit",
                "--parallelism",
                "8",
                "--listen",
                "127.0.0.1:7443,10.0.0.1:7443"
            ])
        );
        assert_eq!(args_from_yaml("").unwrap(), Vec::<OsString>::new());
    }

    #[test]
    fn an_unknown_key_or_a_list_is_refused_naming_it() {
        let e = args_from_yaml("state_dir: /srv\n").unwrap_err();
        assert!(e.contains("unknown key \"state_dir\""), "{e}");
        assert!(e.contains("state-dir"), "{e}");
        let e = args_from_yaml("listen: [a, b]\n").unwrap_err();
        assert!(e.starts_with("listen: must be one value"), "{e}");
        assert!(args_from_yaml("- a\n").is_err());
    }

    #[test]
    fn file_flags_go_right_after_server() {
        let extra = os(&["--region", "r1"]);
        assert_eq!(
            insert_after(
                &os(&["knit", "--config", "c", "server", "--region", "r2"]),
                &["server"],
                extra.clone()
            ),
            Some(os(&[
                "knit", "--config", "c", "server", "--region", "r1", "--region", "r2"
            ]))
        );
        assert_eq!(
            insert_after(
                &os(&["knit", "server", "--config-file", "f", "init"]),
                &["server", "init"],
                extra.clone()
            ),
            Some(os(&[
                "knit",
                "server",
                "--config-file",
                "f",
                "init",
                "--region",
                "r1"
            ]))
        );
        assert_eq!(
            insert_after(&os(&["knit", "get", "server"]), &["server"], extra),
            None
        );
    }

    #[test]
    fn an_oversized_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("knit-server-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.yaml");
        std::fs::write(&path, "#".repeat(MAX_BYTES as usize + 10)).unwrap();
        let e = file_args(&path).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.contains("larger than"), "{e}");
    }
}
