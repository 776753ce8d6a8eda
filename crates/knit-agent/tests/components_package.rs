//! kubernetes-components: package download (real HTTP server on loopback),
//! sha256 verification, the data-disk cache (hit and every kind of miss),
//! installation. Each test runs a full `init` on a node tree.

mod components_support;

use components_support::*;
use knit_agent::package;
use knit_api::{ErrorCode, PhaseName, PhaseOutcome};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const KUBELET: &[u8] = b"#!/bin/sh\nexec sleep 100000\n";
const CTR_STANDIN: &[u8] = b"#!/bin/sh\necho containerd stand-in\n";

fn tarball_path(version: &str) -> String {
    format!("/kubernetes-{version}-linux-amd64.tar.gz")
}

/// Serves the tarball and its `.sha256` sidecar (when given).
fn mirror(tarball: &Path, sidecar: Option<String>) -> Server {
    let body = std::fs::read(tarball).unwrap();
    let name = format!("/{}", tarball.file_name().unwrap().to_string_lossy());
    Server::http(move |req| {
        if req.path == name {
            Response::ok(body.clone())
        } else if req.path == format!("{name}.sha256") {
            match &sidecar {
                Some(s) => Response::ok(s.clone()),
                None => Response::status(404),
            }
        } else {
            Response::status(404)
        }
    })
}

fn package_files() -> Vec<(&'static str, &'static [u8])> {
    vec![("bin/kubelet", KUBELET), ("bin/containerd", CTR_STANDIN)]
}

/// Writes a valid cache of `version` at the default data-disk target.
fn seed_cache(node: &Node, version: &str, files: &[(&str, &[u8])]) -> std::path::PathBuf {
    let dir = node.path("/var/lib/container/ack/kubernetes");
    let mut hashes = BTreeMap::new();
    for (rel, data) in files {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, data).unwrap();
        hashes.insert(rel.to_string(), sha256_hex(data));
    }
    let manifest = serde_json::json!({"version": version, "tarballSha256": "", "files": hashes});
    std::fs::write(dir.join("knit-cache.json"), manifest.to_string()).unwrap();
    dir
}

#[test]
fn checksum_mismatch_is_refused_and_nothing_installed() {
    let work = tempfile::tempdir().unwrap();
    let (tarball, sha) = build_package(work.path(), VERSION, &package_files());
    // Wrong digest in the config, then a wrong `.sha256` sidecar.
    for (configured, sidecar) in [
        (Some("0".repeat(64)), Some(sha.clone())),
        (None, Some(format!("{}  x.tar.gz\n", "f".repeat(64)))),
    ] {
        let node = Node::new();
        let server = mirror(&tarball, sidecar);
        let mut config = base_config();
        config.kubernetes.url = Some(server.url("http"));
        config.kubernetes.sha256 = configured;
        let err = node.init(&config).unwrap_err();
        assert_eq!(err.code, ErrorCode::FailChecksumMismatch, "{err}");
        assert!(err.message.contains(&server.url("http")), "{err}");
        assert!(err.message.contains(&sha), "actual digest named: {err}");
        assert!(!node.path("/usr/local/bin/kubelet").exists());
        assert!(!node.path("/var/lib/kubelet/config.yaml").exists());
        let staging = node.path(package::STAGING_DIR);
        let leftovers = std::fs::read_dir(&staging).map(|d| d.count()).unwrap_or(0);
        assert_eq!(leftovers, 0, "staging area emptied");
        let record = &node.journal().phases[&PhaseName::KubernetesComponents];
        assert_eq!(record.outcome, PhaseOutcome::Failed);
        assert_eq!(record.error_code, Some(ErrorCode::FailChecksumMismatch));
    }
}

#[test]
fn download_with_sidecar_installs_and_rerun_is_done() {
    let work = tempfile::tempdir().unwrap();
    let (tarball, sha) = build_package(work.path(), VERSION, &package_files());
    let node = Node::new();
    let server = mirror(&tarball, Some(format!("{sha}  {}\n", tarball.display())));
    let mut config = base_config();
    // A directory URL: the agent appends the tarball's name.
    config.kubernetes.url = Some(format!("{}/", server.url("http")));
    let journal = node.init(&config).expect("init");
    assert!(node
        .log()
        .contains("check cached kubernetes failed: no cache at /var/lib/container/ack/kubernetes"));
    assert_eq!(journal.package_cache_hit, Some(false));
    let size = std::fs::metadata(&tarball).unwrap().len();
    assert_eq!(journal.package_bytes_downloaded, size);
    assert_eq!(server.count(&tarball_path(VERSION)), 1);
    assert_eq!(
        server.count(&format!("{}.sha256", tarball_path(VERSION))),
        1
    );
    let installed = node.path("/usr/local/bin/kubelet");
    assert_eq!(std::fs::read(&installed).unwrap(), KUBELET);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read(node.path("/usr/local/bin/containerd")).unwrap(),
        CTR_STANDIN
    );
    // No data disk is mounted: nothing is cached.
    assert!(!node.path("/var/lib/container/ack/kubernetes").exists());
    assert!(node.log().contains("package not cached"));

    // A rerun verifies and finds everything in place: no download.
    node.init(&config).expect("rerun");
    let record = &node.journal().phases[&PhaseName::KubernetesComponents];
    assert_eq!(record.outcome, PhaseOutcome::Done);
    assert!(record
        .reason
        .as_deref()
        .unwrap()
        .contains("installed and configured"));
    assert_eq!(server.count(&tarball_path(VERSION)), 1);

    // A modified binary is noticed and reinstalled.
    std::fs::write(&installed, b"tampered").unwrap();
    node.init(&config).expect("repair");
    assert_eq!(std::fs::read(&installed).unwrap(), KUBELET);
    assert_eq!(server.count(&tarball_path(VERSION)), 2);
}

#[test]
fn cache_hit_downloads_nothing() {
    let node = Node::new();
    let cache = seed_cache(&node, VERSION, &package_files());
    let server = Server::http(|_| Response::status(500));
    let mut config = base_config();
    config.kubernetes.url = Some(server.url("http"));
    let journal = node.init(&config).expect("init");
    assert_eq!(server.total(), 0, "the mirror is never asked");
    assert_eq!(journal.package_cache_hit, Some(true));
    assert_eq!(journal.package_bytes_downloaded, 0);
    assert!(!node.log().contains("check cached kubernetes failed"));
    assert!(node.log().contains("using cached kubernetes 1.31.4"));
    assert_eq!(
        std::fs::read(node.path("/usr/local/bin/kubelet")).unwrap(),
        std::fs::read(cache.join("bin/kubelet")).unwrap()
    );
}

#[test]
fn cache_miss_reasons_are_logged_and_the_package_downloaded() {
    let work = tempfile::tempdir().unwrap();
    let (tarball, sha) = build_package(work.path(), VERSION, &package_files());
    type Spoil = fn(&Path);
    let cases: [(&str, Spoil, &str); 4] = [
        (
            "corrupt file",
            |cache| std::fs::write(cache.join("bin/kubelet"), b"bit rot").unwrap(),
            "check cached kubernetes failed: cache corrupt: bin/kubelet: sha256 ",
        ),
        (
            "missing file",
            |cache| std::fs::remove_file(cache.join("bin/kubelet")).unwrap(),
            "check cached kubernetes failed: cache corrupt: bin/kubelet: No such file",
        ),
        (
            "corrupt manifest",
            |cache| std::fs::write(cache.join("knit-cache.json"), b"{\"version\":").unwrap(),
            "check cached kubernetes failed: /var/lib/container/ack/kubernetes/knit-cache.json is corrupt",
        ),
        (
            "other version",
            |_| {},
            "check cached kubernetes failed: cache holds version 1.30.2, this node wants 1.31.4",
        ),
    ];
    for (case, spoil, line) in cases {
        let node = Node::new();
        let version = if case == "other version" {
            "1.30.2"
        } else {
            VERSION
        };
        let cache = seed_cache(&node, version, &package_files());
        spoil(&cache);
        let server = mirror(&tarball, None);
        let mut config = base_config();
        config.kubernetes.url = Some(server.url("http"));
        config.kubernetes.sha256 = Some(sha.clone());
        let journal = node.init(&config).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(
            node.log().contains(line),
            "{case}: log lacks {line:?}:\n{}",
            node.log()
        );
        assert_eq!(server.count(&tarball_path(VERSION)), 1, "{case}");
        assert_eq!(journal.package_cache_hit, Some(false), "{case}");
        assert_eq!(
            std::fs::read(node.path("/usr/local/bin/kubelet")).unwrap(),
            KUBELET,
            "{case}"
        );
    }
}

#[test]
fn download_fills_the_cache_on_a_mounted_data_disk() {
    let work = tempfile::tempdir().unwrap();
    let (tarball, sha) = build_package(work.path(), VERSION, &package_files());
    let node = Node::new();
    // A real mount at the data-disk target (tmpfs stands in for the disk).
    let target = node.path("/var/lib/container");
    std::fs::create_dir_all(&target).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &target,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64m"),
    )
    .expect("mount tmpfs");
    // A stale cache of another version is replaced.
    seed_cache(&node, "1.30.2", &[("bin/kubelet", b"old")]);
    let server = mirror(&tarball, None);
    let mut config = base_config();
    config.kubernetes.url = Some(server.url("http"));
    config.kubernetes.sha256 = Some(sha.clone());
    node.init(&config).expect("init");
    let cache = target.join("ack/kubernetes");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("knit-cache.json")).unwrap()).unwrap();
    assert_eq!(manifest["version"], VERSION);
    assert_eq!(manifest["tarballSha256"], sha);
    assert_eq!(manifest["files"]["bin/kubelet"], sha256_hex(KUBELET));
    assert_eq!(std::fs::read(cache.join("bin/kubelet")).unwrap(), KUBELET);
    assert!(cache.join("images.txt").is_file());
    // Unpacked beside the cache and renamed into place: nothing left over.
    assert!(!target.join("ack/.kubernetes.knit-tmp").exists());
    assert!(!target.join("ack/.kubernetes.knit-old").exists());
    let staging = std::fs::read_dir(node.path(package::STAGING_DIR))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(staging, 0);

    // The next initialization of this disk (e.g. from a snapshot) uses it.
    std::fs::remove_file(node.path("/usr/local/bin/kubelet")).unwrap();
    let journal = node
        .init_forcing(&config, Some(PhaseName::KubernetesComponents))
        .expect("rerun");
    assert_eq!(journal.package_cache_hit, Some(true));
    assert_eq!(server.count(&tarball_path(VERSION)), 1);
    assert_eq!(
        std::fs::read(node.path("/usr/local/bin/kubelet")).unwrap(),
        KUBELET
    );
}

#[test]
fn transient_errors_are_retried_then_reported() {
    let work = tempfile::tempdir().unwrap();
    let (tarball, sha) = build_package(work.path(), VERSION, &package_files());
    let body = std::fs::read(&tarball).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    // The first answer is a 503, the second the tarball.
    let server = Server::http(move |_| {
        if seen.fetch_add(1, Ordering::SeqCst) == 0 {
            Response::status(503)
        } else {
            Response::ok(body.clone())
        }
    });
    let node = Node::new();
    let mut config = base_config();
    config.kubernetes.url = Some(server.url("http"));
    config.kubernetes.sha256 = Some(sha);
    config.kubernetes.download_attempts = 3;
    node.init(&config).expect("init after a retry");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(node.log().contains("503"));

    // A mirror that never has the package: every attempt, then a clear error.
    let node = Node::new();
    let missing = Server::http(|_| Response::status(404));
    config.kubernetes.url = Some(missing.url("http"));
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailDownloadKubernetes);
    assert!(err
        .message
        .contains(&format!("{}{}", missing.url("http"), tarball_path(VERSION))));
    // 404 is not transient: one request only.
    assert_eq!(missing.count(&tarball_path(VERSION)), 1);
}

#[test]
fn local_directory_sources() {
    let work = tempfile::tempdir().unwrap();
    // An unpacked pkg/kubernetes inside the node's tree, no digest configured.
    let node = Node::new();
    let (tarball, _) = build_package(work.path(), VERSION, &package_files());
    let dir = node.path("/opt/knit-packages");
    package::unpack(&tarball, &dir.join("pkg/kubernetes")).unwrap();
    let mut config = base_config();
    config.kubernetes.dir = Some("/opt/knit-packages".into());
    node.init(&config).expect("init from a local directory");
    assert_eq!(
        std::fs::read(node.path("/usr/local/bin/kubelet")).unwrap(),
        KUBELET
    );

    // A tampered file in that directory is caught by knit-package.json.
    let node = Node::new();
    let dir = node.path("/opt/knit-packages");
    package::unpack(&tarball, &dir.join("pkg/kubernetes")).unwrap();
    std::fs::write(dir.join("pkg/kubernetes/bin/kubelet"), b"evil").unwrap();
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailChecksumMismatch);
    assert!(err.message.contains("bin/kubelet"), "{err}");
    assert!(!node.path("/usr/local/bin/kubelet").exists());

    // The tarball in the directory, checked against its `.sha256` file.
    let node = Node::new();
    let dir = node.path("/opt/knit-packages");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&tarball, dir.join(tarball.file_name().unwrap())).unwrap();
    std::fs::write(
        dir.join(format!(
            "{}.sha256",
            tarball.file_name().unwrap().to_string_lossy()
        )),
        "1".repeat(64),
    )
    .unwrap();
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailChecksumMismatch);

    // No source at all.
    let node = Node::new();
    let err = node.init(&base_config()).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailDownloadKubernetes);
    assert!(err.message.contains("kubernetes.url"), "{err}");
}

#[test]
fn a_download_without_any_checksum_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let (tarball, _) = build_package(work.path(), VERSION, &package_files());
    // The mirror has the tarball but no `.sha256`, and none is configured.
    let node = Node::new();
    let server = mirror(&tarball, None);
    let mut config = base_config();
    config.kubernetes.url = Some(server.url("http"));
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailDownloadKubernetes);
    assert!(err.message.contains("set kubernetes.sha256"), "{err}");
    assert_eq!(server.count(&tarball_path(VERSION)), 0, "never downloaded");
    assert!(!node.path("/usr/local/bin/kubelet").exists());

    // An unreachable mirror is named as such, after the configured attempts.
    let node = Node::new();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    config.kubernetes.url = Some(format!("http://{closed}"));
    config.kubernetes.download_attempts = 2;
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailDownloadKubernetes);
    assert!(err.message.contains(&format!("http://{closed}")), "{err}");
    assert!(err.message.contains("reaches the mirror"), "{err}");
    assert!(node.log().contains("(attempt 1/2)"), "{}", node.log());
}

#[test]
fn cni_plugins_and_default_network_config_are_installed_unless_one_exists() {
    let work = tempfile::tempdir().unwrap();
    let conflist: &[u8] =
        br#"{"cniVersion":"1.0.0","name":"knit","plugins":[{"type":"loopback"}]}"#;
    let mut files = package_files();
    files.push(("cni/bin/loopback", b"#!/bin/sh\n"));
    files.push(("cni/net.d/10-knit.conflist", conflist));
    let (tarball, _) = build_package(work.path(), VERSION, &files);
    let mut config = base_config();
    config.kubernetes.dir = Some("/opt/knit-packages".into());

    let node = Node::new();
    package::unpack(&tarball, &node.path("/opt/knit-packages/pkg/kubernetes")).unwrap();
    node.init(&config).expect("init");
    assert!(node.path("/opt/cni/bin/loopback").is_file());
    assert_eq!(
        std::fs::read(node.path("/etc/cni/net.d/10-knit.conflist")).unwrap(),
        conflist
    );

    // A network plugin's own configuration is never replaced.
    let node = Node::new();
    package::unpack(&tarball, &node.path("/opt/knit-packages/pkg/kubernetes")).unwrap();
    std::fs::create_dir_all(node.path("/etc/cni/net.d")).unwrap();
    std::fs::write(node.path("/etc/cni/net.d/05-plugin.conflist"), b"{}").unwrap();
    node.init(&config).expect("init");
    assert!(!node.path("/etc/cni/net.d/10-knit.conflist").exists());
    assert!(node.log().contains("already holds a network configuration"));
}

/// The package's Kubernetes version cannot be read, or is not the one asked
/// for: `FailGetKubeVersion` (it was FailInstallComponents), nothing installed.
#[test]
fn package_version_unreadable_or_other_is_fail_get_kube_version() {
    let work = tempfile::tempdir().unwrap();
    let (tarball, _) = build_package(work.path(), "1.30.2", &package_files());
    let mut config = base_config();
    config.kubernetes.dir = Some("/opt/knit-packages".into());

    // Another version in the package.
    let node = Node::new();
    package::unpack(
        &tarball,
        &node.path("/opt/knit-packages").join("pkg/kubernetes"),
    )
    .unwrap();
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailGetKubeVersion, "{err}");
    assert!(
        err.message.contains("1.30.2") && err.message.contains(VERSION),
        "{err}"
    );
    assert!(!node.path("/usr/local/bin/kubelet").exists());
    assert_eq!(
        node.journal().phases[&PhaseName::KubernetesComponents].error_code,
        Some(ErrorCode::FailGetKubeVersion)
    );

    // No readable version at all (the manifest is not JSON).
    let node = Node::new();
    let pkg = node.path("/opt/knit-packages").join("pkg/kubernetes");
    package::unpack(&tarball, &pkg).unwrap();
    std::fs::write(pkg.join(package::PACKAGE_MANIFEST), b"{ truncated").unwrap();
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailGetKubeVersion, "{err}");
    assert!(err.message.contains(package::PACKAGE_MANIFEST), "{err}");
}

/// A cache made by hand with the seed's own procedure (`tar -xvf` the
/// package, `mv pkg/kubernetes /var/lib/container/ack/`) has no
/// knit-cache.json. It is used (before: refused for the missing manifest,
/// the package downloaded again): the version and every file are checked
/// against the package's own knit-package.json, the log says so, and the
/// missing knit-cache.json is written. One of another version, or with a
/// damaged file, is not used.
#[test]
fn a_hand_made_cache_is_checked_and_used() {
    let work = tempfile::tempdir().unwrap();
    let (tarball, sha) = build_package(work.path(), VERSION, &package_files());
    let hand_made = |node: &Node| {
        let unpack = work.path().join(format!("unpack-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&unpack);
        std::fs::create_dir_all(&unpack).unwrap();
        let st = std::process::Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .current_dir(&unpack)
            .status()
            .unwrap();
        assert!(st.success());
        let ack = node.path("/var/lib/container/ack");
        std::fs::create_dir_all(&ack).unwrap();
        let st = std::process::Command::new("mv")
            .arg(unpack.join("pkg/kubernetes"))
            .arg(&ack)
            .status()
            .unwrap();
        assert!(st.success());
        ack.join("kubernetes")
    };

    let node = Node::new();
    let cache = hand_made(&node);
    assert!(!cache.join("knit-cache.json").exists());
    let server = Server::http(|_| Response::status(500));
    let mut config = base_config();
    config.kubernetes.url = Some(server.url("http"));
    let journal = node.init(&config).expect("init");
    assert_eq!(server.total(), 0, "the mirror is never asked");
    assert_eq!(journal.package_cache_hit, Some(true));
    let log = node.log();
    assert!(!log.contains("check cached kubernetes failed"), "{log}");
    assert!(
        log.contains("made by hand (no knit-cache.json)")
            && log.contains("checked against its knit-package.json: version 1.31.4, 2 files present with matching sha256"),
        "{log}"
    );
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("knit-cache.json")).unwrap()).unwrap();
    assert_eq!(written["version"], VERSION);
    assert_eq!(
        std::fs::read(node.path("/usr/local/bin/kubelet")).unwrap(),
        KUBELET
    );

    // Another version made by hand: named, and the package downloaded.
    let node = Node::new();
    let other = hand_made(&node);
    let text = std::fs::read_to_string(other.join("knit-package.json")).unwrap();
    std::fs::write(
        other.join("knit-package.json"),
        text.replace(VERSION, "1.30.9"),
    )
    .unwrap();
    let server = mirror(&tarball, Some(sha.clone()));
    let mut config = base_config();
    config.kubernetes.url = Some(server.url("http"));
    let journal = node.init(&config).expect("init");
    assert_eq!(journal.package_cache_hit, Some(false));
    assert!(
        node.log().contains("check cached kubernetes failed: hand-made cache (no knit-cache.json) holds version 1.30.9, this node wants 1.31.4"),
        "{}",
        node.log()
    );

    // A damaged file: refused with the file named.
    let node = Node::new();
    let damaged = hand_made(&node);
    std::fs::write(damaged.join("bin/kubelet"), b"bit rot").unwrap();
    let server = mirror(&tarball, Some(sha));
    let mut config = base_config();
    config.kubernetes.url = Some(server.url("http"));
    node.init(&config).expect("init");
    assert!(
        node.log()
            .contains("hand-made cache (no knit-cache.json) corrupt: bin/kubelet: sha256"),
        "{}",
        node.log()
    );
}

/// A node image preloaded as `knit image preload` does (`knit-agent --root
/// IMAGE preload`): a node on it takes the package from the image when it
/// was made from the tarball the config names, asks the mirror for
/// nothing and rewrites no binary in place; an image made from another
/// tarball is passed over for the download, saying why.
#[test]
fn a_preloaded_image_is_used_only_for_the_tarball_the_config_names() {
    use std::os::unix::fs::MetadataExt;
    let work = tempfile::tempdir().unwrap();
    let (tarball, sha) = build_package(work.path(), VERSION, &package_files());
    let agent = work.path().join("knit-agent");
    std::fs::write(&agent, b"#!/bin/sh\n").unwrap();
    let preload = |node: &Node, tarball: &Path, sha: &str| {
        let image = knit_agent::host::Host::without_log(node.root());
        package::preload(&image, tarball, VERSION, Some(sha), Some(&agent)).expect("preload")
    };

    let node = Node::new();
    let done = preload(&node, &tarball, &sha);
    assert_eq!(done.tarball_sha256, sha);
    assert_eq!(done.agent_sha256, Some(sha256_hex(b"#!/bin/sh\n")));
    assert_eq!(
        std::fs::read(node.path(package::PRELOADED_AGENT)).unwrap(),
        b"#!/bin/sh\n"
    );
    // An image holds no node's undo ledger.
    assert!(!node.path(knit_agent::ledger::LEDGER_DIR).exists());
    let kubelet = node.path("/usr/local/bin/kubelet");
    let inode = std::fs::metadata(&kubelet).unwrap().ino();
    // A wrong digest is refused before anything is unpacked.
    let other = Node::new();
    let err = package::preload(
        &knit_agent::host::Host::without_log(other.root()),
        &tarball,
        VERSION,
        Some(&"0".repeat(64)),
        None,
    )
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::FailChecksumMismatch, "{err}");
    assert!(!other.path(package::PRELOAD_DIR).exists());

    // A data-disk cache (from a snapshot) of the same tarball: the image's
    // copy is used, the cache neither read through nor rewritten.
    let cache = seed_cache(&node, VERSION, &[("bin/kubelet", b"not read")]);
    let manifest = serde_json::json!({"version": VERSION, "tarballSha256": sha,
        "files": {"bin/kubelet": sha256_hex(KUBELET)}});
    std::fs::write(cache.join("knit-cache.json"), manifest.to_string()).unwrap();

    let server = mirror(&tarball, None);
    let mut config = base_config();
    config.kubernetes.url = Some(server.url("http"));
    config.kubernetes.sha256 = Some(sha.clone());
    let journal = node.init(&config).expect("init");
    assert!(
        node.log().contains(
            "the data-disk cache /var/lib/container/ack/kubernetes holds the same package: kept"
        ),
        "{}",
        node.log()
    );
    assert_eq!(
        std::fs::read(cache.join("bin/kubelet")).unwrap(),
        b"not read"
    );
    assert_eq!(server.total(), 0, "the mirror is never asked");
    assert_eq!(journal.package_bytes_downloaded, 0);
    assert!(
        node.log()
            .contains("using kubernetes 1.31.4 preloaded in the image (/opt/knit/kubernetes)"),
        "{}",
        node.log()
    );
    assert_eq!(
        std::fs::metadata(&kubelet).unwrap().ino(),
        inode,
        "the preloaded kubelet is used where it is, not rewritten"
    );

    // An image preloaded from another build of the version: downloaded.
    let other_dir = work.path().join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let (other_tarball, other_sha) = build_package(
        &other_dir,
        VERSION,
        &[("bin/kubelet", b"#!/bin/sh\necho other\n")],
    );
    let node = Node::new();
    preload(&node, &other_tarball, &other_sha);
    let journal = node.init(&config).expect("init");
    assert_eq!(server.count(&tarball_path(VERSION)), 1);
    assert!(journal.package_bytes_downloaded > 0);
    assert!(
        node.log().contains(&format!(
            "was made from a tarball with sha256 {other_sha}, this node wants {sha}"
        )),
        "{}",
        node.log()
    );
    assert_eq!(
        std::fs::read(node.path("/usr/local/bin/kubelet")).unwrap(),
        KUBELET
    );
}

/// A preloaded image's binaries are hard links to its cache files: a node
/// hashes each file once (as the cache's) and still catches a tampered
/// binary, whichever name was tampered with and how.
#[test]
fn a_preloaded_binary_is_hashed_once_and_tampering_is_still_caught() {
    use std::os::unix::fs::MetadataExt;
    let work = tempfile::tempdir().unwrap();
    let (tarball, sha) = build_package(work.path(), VERSION, &package_files());
    let server = mirror(&tarball, None);
    let mut config = base_config();
    config.kubernetes.url = Some(server.url("http"));
    config.kubernetes.sha256 = Some(sha.clone());
    let installed = "/usr/local/bin/kubelet";
    let cached = format!("{}/bin/kubelet", package::PRELOAD_DIR);
    let preloaded = || {
        let node = Node::new();
        let image = knit_agent::host::Host::without_log(node.root());
        package::preload(&image, &tarball, VERSION, Some(&sha), None).expect("preload");
        node
    };
    let ino = |node: &Node, abs: &str| std::fs::metadata(node.path(abs)).unwrap().ino();
    // What a node could do: put another file in its place.
    let replace = |node: &Node, abs: &str, data: &[u8]| {
        let tmp = node.path(&format!("{abs}.new"));
        std::fs::write(&tmp, data).unwrap();
        std::fs::rename(&tmp, node.path(abs)).unwrap();
    };
    let preloaded_used = |node: &Node| {
        node.log()
            .contains("using kubernetes 1.31.4 preloaded in the image (/opt/knit/kubernetes)")
    };

    // Untouched: one inode under both names, used where it is.
    let node = preloaded();
    let inode = ino(&node, installed);
    assert_eq!(inode, ino(&node, &cached), "installed as a hard link");
    node.init(&config).expect("init");
    assert!(preloaded_used(&node), "{}", node.log());
    assert_eq!(ino(&node, installed), inode, "not rewritten");
    assert_eq!(server.total(), 0);

    // The installed binary replaced (the cache intact): no longer the
    // verified file, so hashed, found wrong and installed from the cache.
    let node = preloaded();
    replace(&node, installed, b"#!/bin/sh\necho tampered\n");
    node.init(&config).expect("init");
    assert!(preloaded_used(&node), "{}", node.log());
    assert_eq!(std::fs::read(node.path(installed)).unwrap(), KUBELET);
    assert_eq!(server.total(), 0);

    // The shared file written in place (both names): the cache's check
    // fails, the package is downloaded and the binary replaced.
    let node = preloaded();
    std::fs::write(node.path(installed), b"#!/bin/sh\necho tampered\n").unwrap();
    node.init(&config).expect("init");
    assert!(
        node.log().contains("cache corrupt: bin/kubelet: sha256"),
        "{}",
        node.log()
    );
    assert!(!preloaded_used(&node), "{}", node.log());
    assert_eq!(server.count(&tarball_path(VERSION)), 1);
    assert_eq!(std::fs::read(node.path(installed)).unwrap(), KUBELET);

    // The cache's file replaced (the installed binary intact): the cache's
    // check fails, and the installed binary, hashed, is kept as it is.
    let node = preloaded();
    let inode = ino(&node, installed);
    replace(&node, &cached, b"#!/bin/sh\necho tampered\n");
    node.init(&config).expect("init");
    assert!(
        node.log().contains("cache corrupt: bin/kubelet: sha256"),
        "{}",
        node.log()
    );
    assert_eq!(server.count(&tarball_path(VERSION)), 2);
    assert_eq!(ino(&node, installed), inode, "kept: its sha256 is right");
    assert_eq!(std::fs::read(node.path(installed)).unwrap(), KUBELET);
}
