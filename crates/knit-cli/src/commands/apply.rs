//! `knit create|apply|diff -f FILE`: each NodePool or Cluster document of a
//! file sent to the server, one line per document. A file may hold several
//! documents, and a document may be a list (`items:`, what `knit get -o
//! yaml|json` prints for several), so `knit get … -o yaml | knit apply -f -`
//! works; the fields only the server sets are ignored by the server.

use crate::error::{io, CliError, Result};
use knit_api::views::{DryRun, PoolWriteQuery};
use knit_client::Client;
use serde::Deserialize as _;
use serde_json::Value;
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

/// A document refused by the CLI's own check (a Cluster has no server dry
/// run), as the server would answer it: its code printed once.
fn refused_here(e: knit_api::ApiError) -> knit_client::ClientError {
    let errors = match &e {
        knit_api::ApiError::Invalid(list) => list.clone(),
        knit_api::ApiError::Parse { .. } => Vec::new(),
    };
    knit_client::ClientError::Api {
        status: 422,
        code: e.code().to_string(),
        message: e.to_string(),
        errors,
    }
}

/// `--dry-run` of create and apply, as kubectl takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DryRunMode {
    /// Nothing is sent: the documents are only read.
    Client,
    /// The server makes every check of the write and stores nothing.
    Server,
    /// A real write.
    None,
}

/// One document of the input: its kind, name and text.
struct Doc {
    /// Its place in the input (1-based; `3.2`: the second item of the
    /// third document).
    at: String,
    kind: String,
    name: String,
    /// As read (YAML keeps the document's order, so that an error's line
    /// and column from the server are near the user's).
    value: serde_yaml_ng::Value,
}

impl Doc {
    fn body(&self) -> Result<String> {
        serde_yaml_ng::to_string(&self.value)
            .map_err(|e| CliError::Usage(format!("document {}: {e}", self.at)))
    }

    /// `nodepool/workers`, as kubectl names an object.
    fn object(&self) -> String {
        format!("{}/{}", self.kind.to_lowercase(), self.name)
    }
}

/// The documents of `text`, lists unrolled.
fn documents(file: &Path, text: &str) -> Result<Vec<Doc>> {
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml_ng::Value::deserialize(doc)
            .map_err(|e| CliError::Usage(format!("{}: document {}: {e}", file.display(), i + 1)))?;
        if value.is_null() {
            continue;
        }
        let list = value.get("kind").is_none_or(|k| k.as_str() == Some("List"));
        match value
            .get("items")
            .and_then(serde_yaml_ng::Value::as_sequence)
        {
            Some(items) if list => {
                for (j, item) in items.iter().enumerate() {
                    docs.push(doc_of(format!("{}.{}", i + 1, j + 1), item.clone()));
                }
            }
            _ => docs.push(doc_of((i + 1).to_string(), value)),
        }
    }
    Ok(docs)
}

fn doc_of(at: String, value: serde_yaml_ng::Value) -> Doc {
    let text = |v: Option<&serde_yaml_ng::Value>| {
        v.and_then(serde_yaml_ng::Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Doc {
        kind: text(value.get("kind")),
        name: text(value.get("metadata").and_then(|m| m.get("name"))),
        at,
        value,
    }
}

pub fn submit(
    c: &Client,
    file: &Path,
    apply: bool,
    strict: bool,
    dry_run: DryRunMode,
) -> Result<ExitCode> {
    let text = read_input(file)?;
    let mut failed = false;
    let query = PoolWriteQuery {
        strict,
        dry_run: (dry_run == DryRunMode::Server).then_some(DryRun::All),
    };
    let suffix = match dry_run {
        DryRunMode::Client => " (dry run)",
        DryRunMode::Server => " (server dry run)",
        DryRunMode::None => "",
    };
    for doc in documents(file, &text)? {
        let body = doc.body()?;
        // Only the header is read here: the server validates the rest.
        let outcome = match doc.kind.as_str() {
            "NodePool" | "Cluster" if dry_run == DryRunMode::Client => {
                Ok(if apply { "configured" } else { "created" })
            }
            "NodePool" => c
                .write_pool(apply.then_some(doc.name.as_str()), &body, query)
                .map(|p| print_warnings(&p.warnings))
                .map(|_| if apply { "configured" } else { "created" }),
            // The cluster has no dry run: its document is checked here.
            "Cluster" if dry_run == DryRunMode::Server => knit_api::Cluster::from_yaml(&body)
                .map(|_| "configured")
                .map_err(refused_here),
            "Cluster" => c.apply_cluster(&body).map(|_| "configured"),
            other => {
                eprintln!(
                    "error [Usage]: document {}: kind {other:?} is not NodePool or Cluster",
                    doc.at
                );
                failed = true;
                continue;
            }
        };
        match outcome {
            Ok(what) => println!("{} {what}{suffix}", doc.object()),
            Err(e) => {
                eprintln!("error [{}]: {}: {e}", e.code(), doc.object());
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

/// The parts of a document `knit diff` compares: what an apply changes
/// (not the status, nor the fields only the server sets).
fn comparable(v: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for key in ["apiVersion", "kind", "spec"] {
        if let Some(x) = v.get(key) {
            out.insert(key.into(), x.clone());
        }
    }
    let mut meta = serde_json::Map::new();
    for key in ["name", "labels"] {
        if let Some(x) = v.get("metadata").and_then(|m| m.get(key)) {
            meta.insert(key.into(), x.clone());
        }
    }
    out.insert("metadata".into(), Value::Object(meta));
    Value::Object(out)
}

/// A unified diff of two documents as YAML; empty when they are the same.
pub fn unified(object: &str, live: Option<&Value>, merged: &Value) -> String {
    let old = live
        .map(|v| crate::output::yaml(&comparable(v)))
        .unwrap_or_default();
    let new = crate::output::yaml(&comparable(merged));
    if old == new {
        return String::new();
    }
    similar::TextDiff::from_lines(&old, &new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("live/{object}"), &format!("merged/{object}"))
        .to_string()
}

/// `knit diff -f FILE`: what `knit apply -f FILE` would change, as a
/// unified diff of each object (the live one against what the server
/// would store, from its dry run). Exit code as kubectl's: 0 no
/// difference, 1 some, 2 (and a message) an error.
pub fn diff(c: &Client, file: &Path, strict: bool) -> Result<ExitCode> {
    let text = read_input(file)?;
    let mut differs = false;
    let mut failed = false;
    for doc in documents(file, &text)? {
        let body = doc.body()?;
        let pair: std::result::Result<(Option<Value>, Value), CliError> = match doc.kind.as_str() {
            "NodePool" => (|| {
                let live = match c.get_pool(&doc.name) {
                    Ok(p) => Some(p.raw),
                    Err(e) if e.status() == Some(404) => None,
                    Err(e) => return Err(e.into()),
                };
                let query = PoolWriteQuery {
                    strict,
                    dry_run: Some(DryRun::All),
                };
                let merged = c.write_pool(Some(&doc.name), &body, query)?;
                let merged = serde_json::to_value(&merged)
                    .map_err(|e| CliError::Failed(format!("{}: {e}", doc.object())))?;
                Ok((live, merged))
            })(),
            "Cluster" => (|| {
                let live = c.cluster()?.raw;
                let merged = knit_api::Cluster::from_yaml(&body).map_err(refused_here)?;
                let merged = serde_json::to_value(&merged)
                    .map_err(|e| CliError::Failed(format!("{}: {e}", doc.object())))?;
                Ok((Some(live), merged))
            })(),
            other => Err(CliError::Usage(format!(
                "document {}: kind {other:?} is not NodePool or Cluster",
                doc.at
            ))),
        };
        match pair {
            Ok((live, merged)) => {
                let d = unified(&doc.object(), live.as_ref(), &merged);
                differs |= !d.is_empty();
                print!("{d}");
            }
            Err(e) => {
                eprintln!("error [{}]: {}: {e}", e.code(), doc.object());
                failed = true;
            }
        }
    }
    Ok(ExitCode::from(if failed {
        2
    } else if differs {
        1
    } else {
        0
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_are_unrolled_and_empty_documents_skipped() {
        let text = "---\nitems:\n- kind: NodePool\n  metadata: {name: a}\n- kind: NodePool\n  metadata: {name: b}\n---\n---\nkind: Cluster\nmetadata: {name: c}\n";
        let docs = documents(Path::new("-"), text).unwrap();
        let got: Vec<(String, String)> = docs.iter().map(|d| (d.at.clone(), d.object())).collect();
        assert_eq!(
            got,
            [
                ("1.1".to_string(), "nodepool/a".to_string()),
                ("1.2".into(), "nodepool/b".into()),
                ("3".into(), "cluster/c".into()),
            ]
        );
    }

    #[test]
    fn diffs_leave_out_the_server_set_fields() {
        let live = json!({"apiVersion": "knit.dev/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "w", "creationTimestampMs": 1}, "spec": {"replicas": 1},
            "status": {"ready": 1}});
        let mut merged = live.clone();
        merged["status"] = json!({"ready": 0});
        merged["metadata"]["creationTimestampMs"] = json!(2);
        assert_eq!(unified("nodepool/w", Some(&live), &merged), "");
        merged["spec"]["replicas"] = json!(3);
        let d = unified("nodepool/w", Some(&live), &merged);
        assert!(d.contains("--- live/nodepool/w"), "{d}");
        assert!(
            d.contains("-  replicas: 1") && d.contains("+  replicas: 3"),
            "{d}"
        );
        let new = unified("nodepool/w", None, &merged);
        assert!(new.contains("+kind: NodePool"), "{new}");
    }
}
