//! `knit create|apply -f FILE`: each NodePool or Cluster document of a
//! file sent to the server, one line per document.

use crate::error::{io, CliError, Result};
use knit_client::Client;
use serde::Deserialize as _;
use std::path::Path;
use std::process::ExitCode;

fn read_input(file: &Path) -> Result<String> {
    if file == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(io("read stdin"))?;
        return Ok(s);
    }
    std::fs::read_to_string(file).map_err(io(format!("read {}", file.display())))
}

/// The server's warnings (e.g. a stale snapshot), as kubectl shows them.
fn print_warnings(warnings: &Option<Vec<String>>) {
    for w in warnings.iter().flatten() {
        eprintln!("Warning: {}", crate::output::cell(w));
    }
}

/// A document's `kind` and `metadata.name`, empty when absent.
#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct Header {
    kind: String,
    metadata: HeaderMeta,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct HeaderMeta {
    name: String,
}

pub fn submit(c: &Client, file: &Path, apply: bool, strict: bool) -> Result<ExitCode> {
    let text = read_input(file)?;
    let mut failed = false;
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .map_err(|e| CliError::Usage(format!("{}: document {}: {e}", file.display(), i + 1)))?;
        if value.is_null() {
            continue;
        }
        let body = serde_yaml::to_string(&value).map_err(|e| CliError::Usage(e.to_string()))?;
        // Only the header is read here: the server validates the rest.
        let Header { kind, metadata } = serde_yaml::from_value(value).unwrap_or_default();
        let name = metadata.name;
        let outcome = match kind.as_str() {
            "NodePool" if apply => c
                .apply_pool(&name, &body, strict)
                .map(|p| print_warnings(&p.warnings))
                .map(|_| "configured"),
            "NodePool" => c
                .create_pool(&body, strict)
                .map(|p| print_warnings(&p.warnings))
                .map(|_| "created"),
            "Cluster" => c.apply_cluster(&body).map(|_| "configured"),
            other => {
                eprintln!(
                    "error: document {}: kind {other:?} is not NodePool or Cluster",
                    i + 1
                );
                failed = true;
                continue;
            }
        };
        match outcome {
            Ok(what) => println!("{}/{name} {what}", kind.to_lowercase()),
            Err(e) => {
                eprintln!("error [{}]: {}/{name}: {e}", e.code(), kind.to_lowercase());
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
