//! `base-packages` live on a sandbox machine of the local cloud (issue 12,
//! item 3): pigz and the available updates come from a knit repository (a
//! flat Debian repository served from the host over HTTP, as the control
//! plane's mirror serves it), and a node with no reachable repository is
//! told so at once. Driven through the `knit-local` CLI built beside
//! `knit-agent` (cargo build --workspace). Run as root.

mod components_support;

use components_support::sandbox::Sandbox;
use components_support::{build_package, VERSION};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

impl Sandbox {
    /// The agent, a Kubernetes package and a node config: the phases before
    /// base-packages run as on any node (a kubelet that only sleeps).
    fn prepare(&self, base_packages: &str) {
        self.copy_in(
            Path::new(env!("CARGO_BIN_EXE_knit-agent")),
            "/usr/local/bin/knit-agent",
            "755",
        );
        let work = tempfile::tempdir().unwrap();
        let (tarball, _) = build_package(
            work.path(),
            VERSION,
            &[("bin/kubelet", b"#!/bin/sh\nexec sleep 100000\n")],
        );
        self.copy_in(
            &tarball,
            &format!(
                "/opt/knit-packages/{}",
                tarball.file_name().unwrap().to_string_lossy()
            ),
            "644",
        );
        let config = work.path().join("node.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: knit.dev/v1alpha1\nkind: NodeConfig\n\
                 node: {{region: test, instanceId: i-packages, ip: {ip}}}\n\
                 dataDisk: {{enabled: false}}\n\
                 kubernetes: {{version: {VERSION}, dir: /opt/knit-packages}}\n\
                 basePackages: {base_packages}\n",
                ip = self.ip
            ),
        )
        .unwrap();
        self.copy_in(&config, "/etc/knit/node.yaml", "600");
    }

    fn init_base_packages(&self) -> serde_json::Value {
        let out = self.sh_out(
            "knit-agent init --config /etc/knit/node.yaml --stop-after base-packages",
            None,
        );
        let log = self.sh("cat /var/log/knit-deploy.log");
        assert!(
            out.status.success(),
            "{}{}\n{log}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let journal: serde_json::Value =
            serde_json::from_str(&self.sh("cat /var/lib/knit/journal.json")).unwrap();
        journal["phases"]["base-packages"].clone()
    }
}

/// A static file server for `root` on every address of the host; the
/// request paths it saw. A `.` path component is dropped, as the mirror does.
fn serve(root: PathBuf) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let root = root.clone();
            let log = log.clone();
            std::thread::spawn(move || answer(stream, &root, &log));
        }
    });
    (port, seen)
}

fn answer(mut stream: TcpStream, root: &Path, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request).unwrap_or(0) == 0 {
            return;
        }
        let mut header = String::new();
        while reader.read_line(&mut header).unwrap_or(0) > 0 && header.trim() != "" {
            header.clear();
        }
        let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
        log.lock().unwrap().push(path.clone());
        let rel: Vec<&str> = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        let body = if rel.contains(&"..") {
            None
        } else {
            std::fs::read(root.join(rel.join("/"))).ok()
        };
        let (status, body) = match body {
            Some(b) => ("200 OK", b),
            None => ("404 Not Found", Vec::new()),
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
            body.len()
        );
        if stream.write_all(head.as_bytes()).is_err() || stream.write_all(&body).is_err() {
            return;
        }
    }
}

/// A package of the machine's image rebuilt from its installed files with
/// another version (dpkg-deb inside the machine); the .deb's bytes.
fn repack(s: &Sandbox, name: &str, version: &str) -> Vec<u8> {
    s.sh_bytes(&format!(
        "set -e; d=/tmp/repack/{name}; rm -rf $d; mkdir -p $d/DEBIAN
         dpkg-query -s {name} | grep -v -E '^(Status|Conffiles|Config-Version):' \
           | sed 's/^Version: .*/Version: {version}/' > $d/DEBIAN/control
         while read -r f; do
           if [ ! -d \"$f\" ] && {{ [ -f \"$f\" ] || [ -L \"$f\" ]; }}; then mkdir -p \"$d$(dirname \"$f\")\"; cp -a \"$f\" \"$d$f\"; fi
         done < /var/lib/dpkg/info/{name}.list
         dpkg-deb --root-owner-group --build $d /tmp/repack/{name}.deb >/dev/null
         cat /tmp/repack/{name}.deb"
    ))
}

fn installed_version(s: &Sandbox, name: &str) -> String {
    s.sh(&format!(
        "dpkg-query -W -f='${{Status}} ${{Version}}' {name} 2>/dev/null || true"
    ))
}

/// A package of nothing but its control file, built inside the machine;
/// the .deb's bytes.
fn empty_package(s: &Sandbox, name: &str, version: &str) -> Vec<u8> {
    s.sh_bytes(&format!(
        "set -e; d=/tmp/empty/{name}-{version}; rm -rf $d; mkdir -p $d/DEBIAN
         printf 'Package: {name}\\nVersion: {version}\\nArchitecture: all\\nMaintainer: knit tests <tests@knit.invalid>\\nDescription: an empty package of the kernel family\\n' > $d/DEBIAN/control
         dpkg-deb --root-owner-group --build $d /tmp/empty/{name}-{version}.deb >/dev/null
         cat /tmp/empty/{name}-{version}.deb"
    ))
}

/// The repository the control plane's mirror serves, made the same way
/// (`knit package build`): pool/, Packages by dpkg-scanpackages, Release
/// with the index's sha256.
fn write_repository(repo: &Path, codename: &str, debs: &[(&str, Vec<u8>)]) {
    std::fs::create_dir_all(repo.join("pool")).unwrap();
    for (name, bytes) in debs {
        std::fs::write(repo.join(format!("pool/{name}.deb")), bytes).unwrap();
    }
    let out = Command::new("dpkg-scanpackages")
        .args(["--multiversion", "pool", "/dev/null"])
        .current_dir(repo)
        .output()
        .expect("dpkg-scanpackages (dpkg-dev; scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(repo.join("Packages"), &out.stdout).unwrap();
    use sha2::Digest;
    let sum = hex::encode(sha2::Sha256::digest(&out.stdout));
    std::fs::write(
        repo.join("Release"),
        format!(
            "Origin: knit\nLabel: knit\nCodename: {codename}\nSHA256:\n {sum} {} Packages\n",
            out.stdout.len()
        ),
    )
    .unwrap();
}

/// pigz is missing on the node and an update of iputils-ping is in the knit
/// repository: base-packages installs the one and applies the other, from
/// that repository only, through a deb822 source it writes.
#[test]
fn pigz_and_updates_come_from_the_knit_repository() {
    let s = Sandbox::new("packages", "kb", 4099, 0);
    let pigz = installed_version(&s, "pigz");
    let ping = installed_version(&s, "iputils-ping");
    let pigz = pigz
        .strip_prefix("install ok installed ")
        .unwrap_or_else(|| panic!("pigz is not in the machine's image: {pigz}"))
        .to_string();
    let ping = ping
        .strip_prefix("install ok installed ")
        .unwrap_or_else(|| panic!("iputils-ping is not in the machine's image: {ping}"))
        .to_string();
    let update = format!("{ping}+knit1");
    let repo = s.dir.path().join("mirror/debian");
    let codename = s.sh(". /etc/os-release && echo $VERSION_CODENAME");
    // A kernel package installed at 1 with 2 in the repository: the
    // security upgrade leaves it at 1 (the seed's `--exclude kernel*`) and
    // does not leave it held.
    let kernel = "linux-image-knit-test";
    empty_package(&s, kernel, "1");
    s.sh(&format!("dpkg -i /tmp/empty/{kernel}-1.deb >/dev/null"));
    write_repository(
        &repo,
        codename.trim(),
        &[
            ("pigz", repack(&s, "pigz", &pigz)),
            ("iputils-ping", repack(&s, "iputils-ping", &update)),
            (kernel, empty_package(&s, kernel, "2")),
        ],
    );
    let (port, seen) = serve(s.dir.path().join("mirror"));
    // The image's own sources point nowhere reachable: only the knit
    // repository can supply anything.
    s.sh(
        "dpkg -r pigz >/dev/null && rm -f /etc/apt/sources.list.d/* \
          && echo 'deb http://192.0.2.1/debian bookworm-security main' > /etc/apt/sources.list",
    );
    assert!(!installed_version(&s, "pigz").contains("install ok installed"));
    let url = format!("http://{}:{port}/debian/", s.gateway());
    s.prepare(&format!("{{repository: \"{url}\"}}"));

    let phase = s.init_base_packages();
    assert_eq!(phase["outcome"], "done", "{phase}");
    let reason = phase["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("installed [pigz] from the knit repository {url}")),
        "{reason}"
    );
    assert!(
        reason.contains("updates applied from it [iputils-ping]"),
        "{reason}"
    );
    assert_eq!(
        installed_version(&s, "pigz"),
        format!("install ok installed {pigz}")
    );
    assert_eq!(
        installed_version(&s, "iputils-ping"),
        format!("install ok installed {update}")
    );
    let held = reason
        .split_once("kernel packages held, not upgraded [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list.split(", ").collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(held.contains(&kernel), "{reason}");
    assert_eq!(installed_version(&s, kernel), "install ok installed 1");
    let holds = s.sh("apt-mark showhold");
    assert!(!holds.contains(kernel), "knit's hold was released: {holds}");
    let source = s.sh("cat /etc/apt/sources.list.d/knit.sources");
    assert!(
        source.contains(&format!("URIs: {url}\nSuites: ./\nTrusted: yes\n")),
        "{source}"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|p| p == "/debian/./Packages")
            && seen.iter().any(|p| p == "/debian/pool/pigz.deb"),
        "{seen:?}"
    );
}

/// No repository answers (a knit repository on an address that drops
/// packets, the image's sources on another and on a name that does not
/// resolve): the phase says so and does not fail; how long it took is
/// printed for docs/benchmarks.md, not asserted.
#[test]
fn an_offline_node_is_told_so_without_waiting() {
    let s = Sandbox::new("packages", "kb", 4099, 1);
    s.sh("rm -f /etc/apt/sources.list.d/* && printf '%s\\n' \
          'deb http://192.0.2.1/debian bookworm main' \
          'deb http://deb.knit-offline.invalid/debian-security bookworm-security main' \
          > /etc/apt/sources.list");
    s.prepare("{repository: \"http://192.0.2.1:7443/mirror/debian/\"}");
    let phase = s.init_base_packages();
    assert_eq!(phase["outcome"], "done", "{phase}");
    let reason = phase["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("security fixes skipped: no package repository reachable"),
        "{reason}"
    );
    // The knit repository is named among those tried, with the probe's time
    // (printed for docs/benchmarks.md; its value is not asserted).
    assert!(
        reason.contains("tried http://192.0.2.1:7443/mirror/debian/, http://192.0.2.1/debian"),
        "{reason}"
    );
    assert!(reason.contains(" ms)"), "{reason}");
    eprintln!(
        "base-packages offline: phase {} ms; {reason}",
        phase["durationMs"]
    );
}

/// Marker precedence 3 and 4 (docs/agent.md), on a live machine:
/// `/var/.skip-yum` skips all of base-packages whatever
/// `/var/.skip-security-fix` says (pigz stays missing); with only
/// `/var/.skip-security-fix` the tools are installed and the update in the
/// repository is not applied.
#[test]
fn skip_yum_wins_and_skip_security_fix_skips_only_the_fixes() {
    let s = Sandbox::new("packages", "kb", 4099, 2);
    let version = |name: &str| {
        let v = installed_version(&s, name);
        v.strip_prefix("install ok installed ")
            .unwrap_or_else(|| panic!("{name} is not in the machine's image: {v}"))
            .to_string()
    };
    let (pigz, ping) = (version("pigz"), version("iputils-ping"));
    let update = format!("{ping}+knit1");
    let repo = s.dir.path().join("mirror/debian");
    let codename = s.sh(". /etc/os-release && echo $VERSION_CODENAME");
    write_repository(
        &repo,
        codename.trim(),
        &[
            ("pigz", repack(&s, "pigz", &pigz)),
            ("iputils-ping", repack(&s, "iputils-ping", &update)),
        ],
    );
    let (port, _) = serve(s.dir.path().join("mirror"));
    s.sh(
        "dpkg -r pigz >/dev/null && rm -f /etc/apt/sources.list.d/* \
          && echo 'deb http://192.0.2.1/debian bookworm-security main' > /etc/apt/sources.list \
          && touch /var/.skip-yum /var/.skip-security-fix",
    );
    let url = format!("http://{}:{port}/debian/", s.gateway());
    s.prepare(&format!("{{repository: \"{url}\"}}"));

    let phase = s.init_base_packages();
    assert_eq!(phase["outcome"], "skipped", "{phase}");
    assert!(
        phase["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("marker /var/.skip-yum present"),
        "{phase}"
    );
    assert!(!installed_version(&s, "pigz").contains("install ok installed"));

    s.sh("rm /var/.skip-yum");
    let phase = s.init_base_packages();
    assert_eq!(phase["outcome"], "done", "{phase}");
    let reason = phase["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("installed [pigz]")
            && reason.contains("updates skipped (marker /var/.skip-security-fix)"),
        "{reason}"
    );
    assert_eq!(
        installed_version(&s, "pigz"),
        format!("install ok installed {pigz}")
    );
    assert_eq!(
        installed_version(&s, "iputils-ping"),
        format!("install ok installed {ping}")
    );
}
