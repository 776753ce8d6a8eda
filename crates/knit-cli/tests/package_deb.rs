//! The Debian package (packaging/debian/build-deb.sh), built from this
//! build's binaries: its contents and control fields, its systemd unit
//! checked by `systemd-analyze verify`, and the packaged `knit` started
//! with the packaged unit's command line and a config file, answering a
//! client. Installing it on a machine is not done here (it would change the
//! host); docs/install.md says what an install does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_knit"))
        .parent()
        .expect("the knit binary has a directory")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn on_path(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Ends the server this test started, by its PID, on every way out.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_debian_package_holds_the_binaries_a_unit_and_a_working_config_file() {
    if !on_path("dpkg-deb") {
        return knit_test_support::missing("dpkg-deb is not installed (Debian's dpkg)");
    }
    for b in [
        "knit-agent",
        "knit-local",
        "knit-kubelet-sim",
        "knit-registry",
    ] {
        assert!(
            bin_dir().join(b).is_file(),
            "{b} is missing: cargo build --workspace --bins"
        );
    }
    let dir = Dir(std::env::temp_dir().join(format!("knit-deb-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let out = run(Command::new("bash")
        .arg(repo().join("packaging/debian/build-deb.sh"))
        .arg("--bin-dir")
        .arg(bin_dir())
        .arg("--out")
        .arg(dir.0.join("out"))
        // Debug binaries are large: xz would spend minutes on them.
        .args(["--compression", "none"]));
    let deb = PathBuf::from(out.trim());
    assert!(deb.is_file(), "no package at {}", deb.display());

    // Contents, with their modes.
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let entry = |path: &str| {
        listing
            .lines()
            .find(|l| l.ends_with(&format!(" .{path}")))
            .unwrap_or_else(|| panic!("{path} is not in the package:\n{listing}"))
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    for b in [
        "knit",
        "knit-agent",
        "knit-local",
        "knit-kubelet-sim",
        "knit-registry",
    ] {
        assert_eq!(entry(&format!("/usr/bin/{b}")), "-rwxr-xr-x");
    }
    assert_eq!(
        entry("/lib/systemd/system/knit-server.service"),
        "-rw-r--r--"
    );
    assert_eq!(entry("/etc/knit/server.yaml"), "-rw-------");
    assert_eq!(entry("/usr/share/doc/knit/install.md"), "-rw-r--r--");
    assert!(
        listing.contains("root/root"),
        "files owned by root:\n{listing}"
    );

    // Control: the name, the dependencies of the main job, the conffile.
    let control = run(Command::new("dpkg-deb").arg("-f").arg(&deb));
    assert!(control.contains("Package: knit\n"), "{control}");
    assert!(control.contains("containerd"), "{control}");
    // knit links Debian's SQLite (no bundled copy).
    assert!(control.contains("libsqlite3-0"), "{control}");
    let ctrl = dir.0.join("control");
    run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&ctrl));
    assert_eq!(
        std::fs::read_to_string(ctrl.join("conffiles")).unwrap(),
        "/etc/knit/server.yaml\n"
    );
    for script in ["postinst", "prerm", "postrm"] {
        assert!(ctrl.join(script).is_file(), "{script} missing");
    }

    let root = dir.0.join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));

    // Every key of the shipped config file (commented or not) is a flag of
    // `knit server`, and every flag is in it.
    let sample = std::fs::read_to_string(root.join("etc/knit/server.yaml")).unwrap();
    let keys: Vec<&str> = sample
        .lines()
        .filter_map(|l| l.strip_prefix("# ").or(Some(l)))
        .filter_map(|l| {
            let (k, _) = l.split_once(": ")?;
            (!k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
            .then_some(k)
        })
        .collect();
    let help = run(Command::new(root.join("usr/bin/knit")).args(["server", "--help"]));
    for k in &keys {
        assert!(
            help.contains(&format!("--{k} ")),
            "server.yaml names {k}, not a flag"
        );
    }
    for line in help.lines() {
        let Some(flag) = line.trim_start().strip_prefix("--") else {
            continue;
        };
        let flag = flag.split_whitespace().next().unwrap_or_default();
        if ["config", "config-file", "write-config", "help"].contains(&flag) {
            continue;
        }
        assert!(keys.contains(&flag), "server.yaml does not list {flag}");
    }

    // The unit: systemd's own check, with ExecStart pointed at the
    // extracted binary (verify insists the command exists).
    let unit =
        std::fs::read_to_string(root.join("lib/systemd/system/knit-server.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/knit server --config-file /etc/knit/server.yaml\n"),
        "{unit}"
    );
    if on_path("systemd-analyze") {
        let knit = root.join("usr/bin/knit");
        let check = dir.0.join("check");
        std::fs::create_dir_all(&check).unwrap();
        let unit_copy = check.join("knit-server.service");
        std::fs::write(
            &unit_copy,
            unit.replace("/usr/bin/knit", &knit.display().to_string()),
        )
        .unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&unit_copy)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "systemd-analyze verify: {said}"
        );
    }

    // The packaged binary, started as the unit starts it, takes its
    // settings from a config file: the client written for it reaches it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config_file = dir.0.join("server.yaml");
    std::fs::write(
        &config_file,
        format!(
            "{sample}\nstate-dir: {}\nprovider: none\ncluster: none\nlisten: 127.0.0.1:{port}\nconsole-listen: \"off\"\n",
            dir.0.join("state").display()
        ),
    )
    .unwrap();
    let client = dir.0.join("client-config");
    let knit = root.join("usr/bin/knit");
    let log = std::fs::File::create(dir.0.join("server.log")).unwrap();
    let server = Server(
        Command::new(&knit)
            .arg("--config")
            .arg(&client)
            .args(["server", "--write-config", "--config-file"])
            .arg(&config_file)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let listed = loop {
        let out = Command::new(&knit)
            .arg("--config")
            .arg(&client)
            .args(["get", "pools", "-o", "json"])
            .output()
            .unwrap();
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the packaged server did not answer on :{port}:\n{}",
            std::fs::read_to_string(dir.0.join("server.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(listed.contains("\"items\""), "{listed}");
    assert!(
        std::fs::read_to_string(&client)
            .unwrap()
            .contains(&format!("127.0.0.1:{port}")),
        "the client config names the file's listen address"
    );
    assert!(dir.0.join("state").is_dir(), "the file's state-dir is used");
    drop(server);

    // A bad key is refused naming it, before anything starts.
    std::fs::write(&config_file, "state_dir: /nowhere\n").unwrap();
    let out = Command::new(&knit)
        .args(["server", "--config-file"])
        .arg(&config_file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("unknown key \"state_dir\""), "{err}");
    assert!(!Path::new("/nowhere").exists());
}
