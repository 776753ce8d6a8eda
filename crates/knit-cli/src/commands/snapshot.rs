//! `knit snapshot create|list|delete|builds`: data-disk snapshots (docs/spec.md §3).

use super::get::{show, GetOpts, Listing};
use super::now_ms;
use crate::error::{CliError, Result};
use crate::output::{age, cell, opt, table};
use clap::Subcommand;
use knit_api::views::{
    BuildStepView, ImageCacheView, NodeView, Snapshot, SnapshotBuildRequest, SnapshotBuildView,
    SnapshotView,
};
use knit_client::{Client, Document};
use serde_json::Value;
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
        /// Deadline of the image pulls (the `images` step; `10m`, `90s` or
        /// seconds): an unreachable registry fails the build then.
        #[arg(long, default_value = "600", value_parser = super::seconds)]
        images_timeout: u64,
        /// Do not wait; print the build id.
        #[arg(long)]
        no_wait: bool,
        /// How long to wait for the build (`30m`, `90s`, or seconds).
        #[arg(long, default_value = "1800", value_parser = super::seconds)]
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
        /// How long to wait for the build (`30m`, `90s`, or seconds).
        #[arg(long, default_value = "1800", value_parser = super::seconds)]
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
            let build = c.build_snapshot(&SnapshotBuildRequest {
                pool: pool.clone(),
                images,
                name,
                keep_builder,
                images_timeout_seconds: Some(images_timeout),
            })?;
            let id = build.build.id;
            println!("snapshot build {id} started from pool {pool}");
            if no_wait {
                return Ok(ExitCode::SUCCESS);
            }
            follow(c, &id, Duration::from_secs(timeout))
        }
        SnapshotAction::List { output } => list(
            c.list_snapshots()?,
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
            |s: &SnapshotView, now| {
                let snap = &s.snapshot;
                vec![
                    cell(&snap.id),
                    cell(&snap.pool),
                    cell(&snap.kubernetes_version),
                    if s.stale {
                        format!("yes (cluster {})", cell(&s.cluster_kubernetes_version))
                    } else {
                        "no".into()
                    },
                    cell(&snap.containerd_version),
                    snap.images.len().to_string(),
                    format!("{:.1}Mi", snap.size_bytes as f64 / 1048576.0),
                    Some(s.used_by.iter().map(cell).collect::<Vec<_>>().join(","))
                        .filter(|u| !u.is_empty())
                        .unwrap_or_else(|| "-".into()),
                    age(snap.created_ms, now),
                ]
            },
        ),
        SnapshotAction::Delete { id } => {
            c.delete_snapshot(&id)?;
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
            let b = c.snapshot_build(&id)?;
            if output.as_deref() == Some("json") {
                println!("{}", knit_api::ser::value_pretty(&b.raw));
                return Ok(ExitCode::SUCCESS);
            }
            print_build(&b.view.build, &b.view.steps);
            Ok(ExitCode::SUCCESS)
        }
        SnapshotAction::Builds {
            id: None, output, ..
        } => list(
            c.snapshot_builds()?,
            output.as_deref(),
            &["ID", "POOL", "STATUS", "STEP", "SNAPSHOT", "BUILDER", "AGE"],
            |b: &SnapshotBuildView, now| {
                vec![
                    cell(&b.id),
                    cell(&b.pool),
                    cell(b.status),
                    cell(&b.step),
                    opt(&b.snapshot_id),
                    opt(&b.builder_instance),
                    age(b.started_ms, now),
                ]
            },
        ),
    }
}

/// `knit get snapshots`.
pub fn get(c: &Client, name: Option<&str>, opts: &GetOpts) -> Result<ExitCode> {
    let listing = Listing {
        what: "snapshots",
        kind: "snapshot",
        name_of: |s: &SnapshotView| s.snapshot.id.clone(),
        labels: None,
        table: snapshot_table,
    };
    show(listing, || Ok(c.list_snapshots()?), name, opts)
}

fn snapshot_table(items: &[&SnapshotView], _wide: bool) -> String {
    let now = now_ms();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| {
            let s = &s.snapshot;
            vec![
                cell(&s.id),
                cell(&s.pool),
                cell(&s.kubernetes_version),
                cell(&s.containerd_version),
                format!("{}Mi", s.size_bytes >> 20),
                age(s.created_ms, now),
            ]
        })
        .collect();
    table(
        &["ID", "POOL", "KUBERNETES", "CONTAINERD", "SIZE", "AGE"],
        &rows,
    )
}

/// The items: as JSON with `-o json` (the list the server sent), else a
/// table with a row per item (`row` gets the item and the time now, for
/// ages).
fn list<T>(
    items: Vec<Document<T>>,
    output: Option<&str>,
    headers: &[&str],
    row: impl Fn(&T, i64) -> Vec<String>,
) -> Result<ExitCode> {
    if output == Some("json") {
        let raw: Vec<Value> = items.into_iter().map(|i| i.raw).collect();
        let doc = serde_json::json!({ "items": raw });
        println!("{}", knit_api::ser::value_pretty(&doc));
        return Ok(ExitCode::SUCCESS);
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = items.iter().map(|item| row(&item.view, now)).collect();
    print!("{}", table(headers, &rows));
    Ok(ExitCode::SUCCESS)
}

fn print_step(s: &BuildStepView, t0: i64) {
    let at = s.at_ms - t0;
    println!(
        "[{:>6.1}s] {:<9} {}",
        at as f64 / 1000.0,
        cell(&s.step),
        cell(&s.message)
    );
}

/// One build: what, where it is, its steps, its end.
fn print_build(b: &SnapshotBuildView, steps: &[BuildStepView]) {
    println!("Build:         {}", cell(&b.id));
    println!("Pool:          {}", cell(&b.pool));
    println!("Status:        {}", cell(b.status));
    println!("Step:          {}", cell(&b.step));
    println!(
        "Builder:       {} (pool {})",
        opt(&b.builder_instance),
        cell(&b.builder_pool)
    );
    println!("Keep builder:  {}", cell(b.keep_builder));
    if let Some(e) = &b.error {
        println!("Error:         {e}");
    }
    if let Some(id) = &b.snapshot_id {
        println!("Snapshot:      {}", cell(id));
    }
    println!("Steps:");
    for s in steps {
        print_step(s, b.started_ms);
    }
}

/// Prints each step as it happens, then the snapshot.
fn follow(c: &Client, id: &str, timeout: Duration) -> Result<ExitCode> {
    let start = Instant::now();
    let mut shown = 0;
    loop {
        let b = c.snapshot_build(id)?.view;
        for s in b.steps.iter().skip(shown) {
            print_step(s, b.build.started_ms);
        }
        shown = b.steps.len();
        if b.done {
            if let Some(e) = &b.build.error {
                return Err(CliError::Failed(format!("snapshot build {id} failed: {e}")));
            }
            if let Some(s) = &b.snapshot {
                print_snapshot(s);
            }
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

fn print_snapshot(s: &Snapshot) {
    println!("snapshot/{} created", cell(&s.id));
    println!("  pool:        {}", cell(&s.pool));
    println!("  kubernetes:  {}", cell(&s.kubernetes_version));
    println!("  containerd:  {}", cell(&s.containerd_version));
    println!("  size:        {} bytes used", cell(s.size_bytes));
    for i in &s.images {
        println!("  image:       {}", cell(i));
    }
}

/// `knit describe node`'s cache section.
pub fn describe_cache(n: &NodeView) {
    print!("{}", cache_lines(n));
}

/// The cache section's lines: the package, the images' counters, and each
/// image that failed to pull with its error (when the node's report file
/// could be read; else where to find them).
pub fn cache_lines(n: &NodeView) -> String {
    let cache = n.cache.as_ref();
    let mut out = String::new();
    match cache.and_then(|c| c.package.as_ref()) {
        Some(p) if p.cache_hit => {
            out.push_str("Package:       data-disk cache hit (0 bytes downloaded)\n")
        }
        Some(p) if p.preloaded => {
            out.push_str("Package:       preloaded in the node image (0 bytes downloaded)\n")
        }
        Some(p) => out.push_str(&format!(
            "Package:       cache miss, {} bytes downloaded\n",
            p.bytes_downloaded
        )),
        None => out.push_str("Package:       (not installed yet)\n"),
    }
    let Some(i): Option<&ImageCacheView> = cache.and_then(|c| c.images.as_ref()) else {
        // The kubelet publishes its report once every image is present or
        // has failed (each failure after its retries, up to minutes).
        out.push_str(
            "Images:        (no report from the kubelet yet: it reports once every system image is present or has failed)\n",
        );
        return out;
    };
    out.push_str(&format!(
        "Images:        cache hit {}, miss {}, failed {}, {} bytes pulled\n",
        i.hit, i.miss, i.failed, i.bytes_pulled
    ));
    let failed: Vec<_> = i
        .images
        .iter()
        .flatten()
        .filter(|img| img.error.is_some())
        .collect();
    for img in &failed {
        out.push_str(&format!(
            "  failed:      {}: {}\n",
            cell(&img.image),
            opt(&img.error)
        ));
    }
    if failed.is_empty() && i.failed > 0 {
        out.push_str(
            "  failed:      (each image's error: /var/lib/kubelet/knit-images.json on the node)\n",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node view with this `cache` (the rest as the server fills it).
    fn node(cache: Value) -> NodeView {
        let mut n = serde_json::json!({
            "name": "n-1", "instance": "w-1", "pool": "w", "status": "Ready",
            "createdMs": 0, "updatedMs": 0,
        });
        if let (Value::Object(fields), Value::Object(extra)) = (&mut n, cache) {
            fields.extend(extra);
        }
        serde_json::from_value(n).unwrap()
    }

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
        let text = cache_lines(&node(n));
        assert!(text.contains("failed 3"), "{text}");
        assert!(text.contains("r/c:1: no such host"), "{text}");
        assert_eq!(text.matches("  failed:").count(), 3, "{text}");
        assert!(!text.contains("no report"), "{text}");
        let summary_only = serde_json::json!({"cache": {"images": {
            "hit": 0, "miss": 0, "failed": 3, "bytesPulled": 0
        }}});
        assert!(cache_lines(&node(summary_only)).contains("knit-images.json"));
    }

    /// Where the package came from: the data-disk cache, the node image,
    /// or the mirror (with the bytes).
    #[test]
    fn the_package_source_is_named() {
        for (package, said) in [
            (serde_json::json!({"cacheHit": true}), "data-disk cache hit"),
            (
                serde_json::json!({"preloaded": true}),
                "preloaded in the node image",
            ),
            (
                serde_json::json!({"bytesDownloaded": 7}),
                "cache miss, 7 bytes downloaded",
            ),
        ] {
            let text = cache_lines(&node(serde_json::json!({"cache": {"package": package}})));
            assert!(
                text.starts_with(&format!("Package:       {said}")),
                "{text}"
            );
        }
    }
}
