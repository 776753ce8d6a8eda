//! `bench/scale.sh` at CI size (issue 31 items 2 and 6): `bash
//! bench/scale.sh 3` with the workspace's binaries scales a pool 0 → 3 → 0
//! on a local cloud of its own, sees all three Ready through kubectl, and
//! finds nothing of its machines on the host after scale-in, nor anything of
//! the run after its server and cloud are taken down (the bench fails
//! otherwise). The figures it prints are not checked: the benchmark's
//! figures are in docs/benchmarks.md, not asserted here.
//!
//! Needs root, the node image, the workspace's binaries and kubectl (as the
//! other end-to-end suites). The bench releases everything itself on exit,
//! SIGTERM included, which this test sends past its deadline.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(480);
const OUTPUT_CAP: u64 = 1 << 20;

fn ensure_node_image() {
    let dir = knit_local::image::images_dir();
    if knit_local::image::current(&dir)
        .expect("read the node image's state")
        .is_none()
    {
        knit_local::image::build(&dir, &mut |line| eprintln!("{line}")).expect("knit image build");
    }
}

fn capped(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut from).take(OUTPUT_CAP).read_to_end(&mut buf);
        // Drain the rest so the bench never blocks on a full pipe.
        let _ = std::io::copy(&mut from, &mut std::io::sink());
        String::from_utf8_lossy(&buf).into_owned()
    })
}

#[test]
fn scale_bench_of_three_machines_leaves_nothing_behind() {
    assert!(
        common::is_root(),
        "this test needs root (the bench makes namespaces, loop devices and a bridge)"
    );
    ensure_node_image();
    for name in ["knit-agent", "knit-local", "knit-kubelet-sim"] {
        common::sibling(name);
    }
    let bin: PathBuf = common::knit()
        .parent()
        .expect("the knit binary's directory")
        .to_path_buf();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::Builder::new()
        .prefix("knit-scale-bench-test-")
        .tempdir()
        .expect("temporary directory");
    let mut child = Command::new("bash")
        .arg(repo.join("bench/scale.sh"))
        .arg("3")
        .env("KNIT_BIN", &bin)
        .env("OUT", out.path())
        .env("CHART", "no")
        .env("IDLE", "2")
        .env("STEADY", "3")
        .env("QUIET", "2")
        .env("AFTER", "2")
        .env("TIMEOUT", "240")
        .env_remove("KNIT_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bash bench/scale.sh 3");
    let bridge: String = format!("kbsc{}", child.id()).chars().take(15).collect();
    let stdout = capped(child.stdout.take().expect("stdout"));
    let stderr = capped(child.stderr.take().expect("stderr"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the bench") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            // Its trap releases the run; SIGKILL only if that hangs too.
            // SAFETY: signalling the child this test started, not yet reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let grace = Instant::now();
            while child.try_wait().expect("wait").is_none() {
                if grace.elapsed() > Duration::from_secs(120) {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            panic!("bench/scale.sh 3 took more than {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    // The bench keeps its server's log in OUT when it fails: its tail too.
    let log = std::fs::read_to_string(out.path().join("server.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    let context = format!(
        "--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- server.log (last 60 lines)\n{}",
        tail.join("\n")
    );
    assert!(
        status.success(),
        "bench/scale.sh 3 failed: {status}\n{context}"
    );
    assert!(
        stdout.contains("left on the host after scale-in (3 machines seen): 0"),
        "{context}"
    );
    assert!(
        stdout.contains("left on the host after down (3 machines seen): 0"),
        "{context}"
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with("| 3 | "))
        .unwrap_or_else(|| panic!("no result row for N = 3\n{context}"));
    assert!(!row.contains("not reached"), "{row}\n{context}");

    // Every node was seen Ready, after the request, and the samples show 3 Ready.
    let nodes = std::fs::read_to_string(out.path().join("nodes.csv")).expect("nodes.csv");
    let ready: Vec<f64> = nodes
        .lines()
        .skip(1)
        .map(|l| {
            l.rsplit(',')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("a node never Ready: {l}\n{nodes}"))
        })
        .collect();
    assert_eq!(ready.len(), 3, "{nodes}");
    assert!(ready.iter().all(|t| *t > 0.0), "{nodes}");
    let samples = std::fs::read_to_string(out.path().join("samples.csv")).expect("samples.csv");
    let header: Vec<&str> = samples.lines().next().unwrap_or("").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("{name} not in {header:?}"))
    };
    let (ready_col, instances_col) = (col("ready"), col("instances"));
    let rows: Vec<Vec<&str>> = samples
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert!(rows.iter().any(|r| r[ready_col] == "3"), "{samples}");
    assert_eq!(
        rows.last().map(|r| r[instances_col]),
        Some("0"),
        "machines left at the last sample\n{samples}"
    );
    // The run's bridge went with its cloud.
    assert!(
        !Path::new("/sys/class/net").join(&bridge).exists(),
        "bridge {bridge} left"
    );
}
