//! `knit snapshot create|list|delete|builds`: data-disk snapshots (SPEC §3).

use crate::output::{age, cell, table};
use crate::{CliError, Result};
use clap::Subcommand;
use knit_client::Client;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum SnapshotAction {
    /// Build a snapshot from a pool: builder node → Ready → out of the
    /// cluster (instance kept) → package cache + images → stopped → data
    /// disk snapshotted → builder released.
    Create {
        #[arg(long)]
        pool: String,
        /// Images to pull into the snapshot (besides the system images).
        #[arg(long, num_args = 0..)]
        images: Vec<String>,
        #[arg(long)]
        name: Option<String>,
        /// Keep the builder instance (stopped) instead of releasing it.
        #[arg(long)]
        keep_builder: bool,
        /// Deadline of the image pulls (the `images` step), in seconds:
        /// an unreachable registry fails the build then.
        #[arg(long, default_value_t = 600)]
        images_timeout: u64,
        /// Do not wait; print the build id.
        #[arg(long)]
        no_wait: bool,
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
    /// List snapshots; STALE = another Kubernetes version than the cluster.
    List {
        #[arg(short = 'o', long)]
        output: Option<String>,
    },
    /// Delete a snapshot (refused while a pool uses it).
    Delete { id: String },
    /// Snapshot builds (stored, kept across server restarts): all, or one
    /// with its steps.
    Builds {
        /// A build id (`build-…`): its steps, status and error.
        id: Option<String>,
        #[arg(short = 'o', long)]
        output: Option<String>,
        /// With an id: wait for the build to end, printing each step.
        #[arg(long)]
        follow: bool,
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
}

pub fn run(c: &Client, action: SnapshotAction) -> Result<ExitCode> {
    match action {
        SnapshotAction::Create {
            pool,
            images,
            name,
            keep_builder,
            images_timeout,
            no_wait,
            timeout,
        } => {
            let body = json!({
                "pool": pool,
                "images": images,
                "name": name,
                "keepBuilder": keep_builder,
                "imagesTimeoutSeconds": images_timeout,
            });
            let b = c.call("POST", "/api/v1/snapshots", Some(&body.to_string()))?;
            let id = b["id"].as_str().unwrap_or_default().to_string();
            println!("snapshot build {id} started from pool {pool}");
            if no_wait {
                return Ok(ExitCode::SUCCESS);
            }
            follow(c, &id, Duration::from_secs(timeout))
        }
        SnapshotAction::List { output } => list(
            c,
            "/api/v1/snapshots",
            output.as_deref(),
            &[
                "ID",
                "POOL",
                "KUBERNETES",
                "STALE",
                "CONTAINERD",
                "IMAGES",
                "SIZE",
                "USED BY",
                "AGE",
            ],
            |s, now| {
                vec![
                    cell(&s["id"]),
                    cell(&s["pool"]),
                    cell(&s["kubernetesVersion"]),
                    if s["stale"] == true {
                        format!("yes (cluster {})", cell(&s["clusterKubernetesVersion"]))
                    } else {
                        "no".into()
                    },
                    cell(&s["containerdVersion"]),
                    s["images"].as_array().map_or(0, |i| i.len()).to_string(),
                    format!(
                        "{:.1}Mi",
                        s["sizeBytes"].as_f64().unwrap_or(0.0) / 1048576.0
                    ),
                    s["usedBy"]
                        .as_array()
                        .map(|u| u.iter().map(cell).collect::<Vec<_>>().join(","))
                        .filter(|u| !u.is_empty())
                        .unwrap_or_else(|| "-".into()),
                    age(s["createdMs"].as_i64().unwrap_or(now), now),
                ]
            },
        ),
        SnapshotAction::Delete { id } => {
            c.call("DELETE", &format!("/api/v1/snapshots/{id}"), None)?;
            println!("snapshot/{id} deleted");
            Ok(ExitCode::SUCCESS)
        }
        SnapshotAction::Builds {
            id: Some(id),
            follow: true,
            timeout,
            ..
        } => follow(c, &id, Duration::from_secs(timeout)),
        SnapshotAction::Builds {
            id: Some(id),
            output,
            ..
        } => {
            let b = c.get(&format!("/api/v1/snapshot-builds/{id}"))?;
            if output.as_deref() == Some("json") {
                println!("{}", serde_json::to_string_pretty(&b).unwrap_or_default());
                return Ok(ExitCode::SUCCESS);
            }
            print_build(&b);
            Ok(ExitCode::SUCCESS)
        }
        SnapshotAction::Builds {
            id: None, output, ..
        } => list(
            c,
            "/api/v1/snapshot-builds",
            output.as_deref(),
            &["ID", "POOL", "STATUS", "STEP", "SNAPSHOT", "BUILDER", "AGE"],
            |b, now| {
                vec![
                    cell(&b["id"]),
                    cell(&b["pool"]),
                    cell(&b["status"]),
                    cell(&b["step"]),
                    cell(&b["snapshotId"]),
                    cell(&b["builderInstance"]),
                    age(b["startedMs"].as_i64().unwrap_or(now), now),
                ]
            },
        ),
    }
}

/// The items at `path`: as JSON with `-o json`, else a table with a row
/// per item (`row` gets the item and the time now, for ages).
fn list(
    c: &Client,
    path: &str,
    output: Option<&str>,
    headers: &[&str],
    row: impl Fn(&Value, i64) -> Vec<String>,
) -> Result<ExitCode> {
    let v = c.get(path)?;
    if output == Some("json") {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    let now = knit_server::store::now_ms();
    let rows: Vec<Vec<String>> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| row(item, now))
        .collect();
    print!("{}", table(headers, &rows));
    Ok(ExitCode::SUCCESS)
}

fn print_step(s: &Value, t0: i64) {
    let at = s["atMs"].as_i64().unwrap_or(t0) - t0;
    println!(
        "[{:>6.1}s] {:<9} {}",
        at as f64 / 1000.0,
        cell(&s["step"]),
        cell(&s["message"])
    );
}

/// One build: what, where it is, its steps, its end.
fn print_build(b: &Value) {
    println!("Build:         {}", cell(&b["id"]));
    println!("Pool:          {}", cell(&b["pool"]));
    println!("Status:        {}", cell(&b["status"]));
    println!("Step:          {}", cell(&b["step"]));
    println!(
        "Builder:       {} (pool {})",
        cell(&b["builderInstance"]),
        cell(&b["builderPool"])
    );
    println!("Keep builder:  {}", cell(&b["keepBuilder"]));
    if let Some(e) = b["error"].as_str() {
        println!("Error:         {e}");
    }
    if !b["snapshotId"].is_null() {
        println!("Snapshot:      {}", cell(&b["snapshotId"]));
    }
    println!("Steps:");
    let t0 = b["startedMs"].as_i64().unwrap_or(0);
    for s in b["steps"].as_array().into_iter().flatten() {
        print_step(s, t0);
    }
}

/// Prints each step as it happens, then the snapshot.
fn follow(c: &Client, id: &str, timeout: Duration) -> Result<ExitCode> {
    let start = Instant::now();
    let mut shown = 0;
    loop {
        let b = c.get(&format!("/api/v1/snapshot-builds/{id}"))?;
        let steps = b["steps"].as_array().cloned().unwrap_or_default();
        let t0 = b["startedMs"].as_i64().unwrap_or(0);
        for s in steps.iter().skip(shown) {
            print_step(s, t0);
        }
        shown = steps.len();
        if b["done"] == true {
            if let Some(e) = b["error"].as_str() {
                return Err(CliError::Failed(format!("snapshot build {id} failed: {e}")));
            }
            print_snapshot(&b["snapshot"]);
            return Ok(ExitCode::SUCCESS);
        }
        if start.elapsed() > timeout {
            return Err(CliError::Failed(format!(
                "snapshot build {id} not done after {}s (it continues on the server)",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn print_snapshot(s: &Value) {
    println!("snapshot/{} created", cell(&s["id"]));
    println!("  pool:        {}", cell(&s["pool"]));
    println!("  kubernetes:  {}", cell(&s["kubernetesVersion"]));
    println!("  containerd:  {}", cell(&s["containerdVersion"]));
    println!("  size:        {} bytes used", cell(&s["sizeBytes"]));
    for i in s["images"].as_array().into_iter().flatten() {
        println!("  image:       {}", cell(i));
    }
}

/// `knit describe node`'s cache section.
pub fn describe_cache(n: &Value) {
    print!("{}", cache_lines(n));
}

/// The cache section's lines: the package, the images' counters, and each
/// image that failed to pull with its error (when the node's report file
/// could be read; else where to find them).
pub fn cache_lines(n: &Value) -> String {
    let c = &n["cache"];
    let mut out = String::new();
    match c["package"]["cacheHit"].as_bool() {
        Some(true) => out.push_str("Package:       data-disk cache hit (0 bytes downloaded)\n"),
        Some(false) => out.push_str(&format!(
            "Package:       cache miss, {} bytes downloaded\n",
            cell(&c["package"]["bytesDownloaded"])
        )),
        None => out.push_str("Package:       (not installed yet)\n"),
    }
    let i = &c["images"];
    if i.is_null() {
        out.push_str("Images:        (no report from the kubelet yet)\n");
        return out;
    }
    out.push_str(&format!(
        "Images:        cache hit {}, miss {}, failed {}, {} bytes pulled\n",
        cell(&i["hit"]),
        cell(&i["miss"]),
        cell(&i["failed"]),
        cell(&i["bytesPulled"])
    ));
    let failed: Vec<&Value> = i["images"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|img| !img["error"].is_null())
        .collect();
    for img in &failed {
        out.push_str(&format!(
            "  failed:      {}: {}\n",
            cell(&img["image"]),
            cell(&img["error"])
        ));
    }
    if failed.is_empty() && i["failed"].as_u64().unwrap_or(0) > 0 {
        out.push_str(
            "  failed:      (each image's error: /var/lib/kubelet/knit-images.json on the node)\n",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node whose kubelet published a report of 3 failed pulls: the
    /// counters and each failure are shown, never "no report".
    #[test]
    fn failed_pulls_are_shown() {
        let n = serde_json::json!({"cache": {"images": {
            "hit": 0, "miss": 0, "failed": 3, "bytesPulled": 0, "source": "node annotation",
            "images": [
                {"image": "r/a:1", "error": "connection refused"},
                {"image": "r/b:1", "error": "connection refused"},
                {"image": "r/c:1", "error": "no such host"},
                {"image": "r/d:1", "cached": true}
            ]
        }}});
        let text = cache_lines(&n);
        assert!(text.contains("failed 3"), "{text}");
        assert!(text.contains("r/c:1: no such host"), "{text}");
        assert_eq!(text.matches("  failed:").count(), 3, "{text}");
        assert!(!text.contains("no report"), "{text}");
        let summary_only = serde_json::json!({"cache": {"images": {
            "hit": 0, "miss": 0, "failed": 3, "bytesPulled": 0
        }}});
        assert!(cache_lines(&summary_only).contains("knit-images.json"));
    }
}
