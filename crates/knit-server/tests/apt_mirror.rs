//! The package mirror's Debian repository as apt sees it (issue 28, item
//! 1): a real `apt-get update` against a real server on loopback (TLS, an
//! ephemeral port), apt's state in a temporary directory (`-o Dir::…`; the
//! host's configuration files, lists and dpkg status are not read or
//! written). A signed repository is read in one `InRelease` with nothing
//! ignored; an unsigned one still finishes, its missing files answered
//! with an empty 404 apt has nothing to read from. Times are not asserted
//! (bench/apt-mirror.sh measures them).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::TestServer;

/// `program args` in `cwd`, killed after `limit`.
fn run(program: &str, args: &[&str], cwd: &Path, limit: Duration) -> Output {
    use std::io::Read;
    let mut child = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {program}: {e} (scripts/setup.sh installs it)"));
    let pipe = |p: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = p {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = pipe(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = pipe(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{program} {} did not finish in {limit:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// A flat repository holding one small package, indexed as `knit package
/// build` indexes it (dpkg-scanpackages, then Release with the index's
/// size and sha256).
fn write_repository(repo: &Path, work: &Path) {
    let pkg = format!("knit-apt-probe-{}", std::process::id());
    let root = work.join("deb");
    std::fs::create_dir_all(root.join("DEBIAN")).unwrap();
    std::fs::write(
        root.join("DEBIAN/control"),
        format!(
            "Package: {pkg}\nVersion: 1.0\nArchitecture: all\nMaintainer: knit <knit@localhost>\nDescription: a package for the apt mirror test\n"
        ),
    )
    .unwrap();
    std::fs::create_dir_all(repo.join("pool")).unwrap();
    let deb = repo.join(format!("pool/{pkg}_1.0_all.deb"));
    let out = run(
        "dpkg-deb",
        &[
            "--build",
            &root.display().to_string(),
            &deb.display().to_string(),
        ],
        work,
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(
        "dpkg-scanpackages",
        &["--multiversion", "pool", "/dev/null"],
        repo,
        Duration::from_secs(60),
    );
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
            "Origin: knit\nLabel: knit\nDate: {}\nSHA256:\n {sum} {} Packages\n",
            knit_os::time::http_date(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
            ),
            out.stdout.len()
        ),
    )
    .unwrap();
}

/// apt's state and configuration in `dir` only: no configuration file of
/// the host is read (`Dir::Etc::main`, `Dir::Etc::Parts`), no list, cache
/// or dpkg status of the host is read or written.
struct Apt {
    dir: PathBuf,
}

impl Apt {
    fn new(dir: PathBuf, url: &str, ca_pem: &str, signed_by: Option<&Path>) -> Apt {
        for d in [
            "lists/partial",
            "cache/archives/partial",
            "sources",
            "parts",
        ] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("status"), "").unwrap();
        std::fs::write(dir.join("ca.pem"), ca_pem).unwrap();
        let trust = match signed_by {
            Some(key) => format!("Signed-By: {}", key.display()),
            None => "Trusted: yes".to_string(),
        };
        std::fs::write(
            dir.join("sources/knit.sources"),
            format!("Types: deb\nURIs: {url}\nSuites: ./\n{trust}\n"),
        )
        .unwrap();
        Apt { dir }
    }

    fn update(&self) -> (String, String) {
        let out = self.update_raw();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "apt-get update failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
        (stdout, stderr)
    }

    fn update_raw(&self) -> Output {
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        let opts = [
            ("Dir::Etc::main", "/dev/null".to_string()),
            ("Dir::Etc::Parts", d("parts")),
            ("Dir::Etc::SourceList", "/dev/null".to_string()),
            ("Dir::Etc::SourceParts", d("sources")),
            ("Dir::State::Lists", d("lists")),
            ("Dir::Cache", d("cache")),
            ("Dir::State::status", d("status")),
            ("Debug::NoLocking", "1".to_string()),
            // The temporary directory is root's: no _apt sandbox.
            ("APT::Sandbox::User", "root".to_string()),
            ("Acquire::https::CaInfo", d("ca.pem")),
            ("Acquire::Retries", "0".to_string()),
            ("Acquire::https::Timeout", "20".to_string()),
        ];
        let mut args: Vec<String> = opts
            .iter()
            .flat_map(|(k, v)| ["-o".to_string(), format!("{k}={v}")])
            .collect();
        args.push("update".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("apt-get", &args, &self.dir, Duration::from_secs(120))
    }
}

#[test]
fn apt_reads_the_signed_repository_in_one_in_release() {
    let mut h = TestServer::new();
    h.start(None);
    let work = h.dir.path().to_path_buf();
    let repo = h.server().control.mirror_dir().join("debian");
    write_repository(&repo, &work);
    knit_server::mirror::sign_debian_repository(&repo, &work.join("gnupg"))
        .expect("sign the repository (gpg: scripts/setup.sh installs it)");
    let key = work.join("knit-archive-keyring.gpg");
    std::fs::copy(repo.join(knit_server::mirror::DEBIAN_REPOSITORY_KEY), &key).unwrap();
    let url = format!("{}/mirror/debian/", h.server().local_url);
    let apt = Apt::new(work.join("apt"), &url, h.server().ca_pem(), Some(&key));

    let (out, err) = apt.update();
    assert!(out.contains("Get:1 ") && out.contains("InRelease"), "{out}");
    assert!(out.contains("Packages"), "{out}");
    for bad in ["Ign:", "Err:"] {
        assert!(!out.contains(bad), "{bad} in:\n{out}");
    }
    assert!(!err.contains("W:") && !err.contains("E:"), "{err}");

    // Again: nothing changed, nothing fetched (If-Modified-Since → 304).
    let (out, err) = apt.update();
    assert!(out.contains("Hit:1 ") && out.contains("InRelease"), "{out}");
    for bad in ["Get:", "Ign:", "Err:"] {
        assert!(!out.contains(bad), "{bad} in:\n{out}");
    }
    assert!(!err.contains("W:") && !err.contains("E:"), "{err}");

    // A Release signed by another key is refused: the signature is checked.
    // In a later second than the first signature: apt asks with
    // If-Modified-Since, whose unit is the second, and would get 304.
    std::thread::sleep(Duration::from_millis(1100));
    knit_server::mirror::sign_debian_repository(&repo, &work.join("gnupg-other")).unwrap();
    let out = apt.update_raw();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("NO_PUBKEY") || text.contains("not signed") || text.contains("signatures"),
        "a foreign signature was accepted:\n{text}"
    );
    // No gpg-agent that signing started outlives it.
    let ours = work.display().to_string();
    let agents: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.starts_with("gpg-agent") && c.contains(&ours))
        .collect();
    assert!(agents.is_empty(), "gpg-agent left running: {agents:?}");
}

#[test]
fn an_unsigned_repository_finishes_and_its_404s_are_empty() {
    let mut h = TestServer::new();
    h.start(None);
    let work = h.dir.path().to_path_buf();
    let repo = h.server().control.mirror_dir().join("debian");
    write_repository(&repo, &work);
    let url = format!("{}/mirror/debian/", h.server().local_url);
    let apt = Apt::new(work.join("apt"), &url, h.server().ca_pem(), None);
    let (out, err) = apt.update();
    assert!(out.contains("Release") && out.contains("Packages"), "{out}");
    assert!(!out.contains("Err:"), "{out}");
    assert!(!err.contains("E:"), "{err}");

    // The 404 apt gets for InRelease: no body, no Content-Type, the
    // connection kept (apt reads nothing and asks its next file on it).
    std::fs::write(work.join("ca.pem"), h.server().ca_pem()).unwrap();
    let out = run(
        "curl",
        &[
            "-sS",
            "--http1.1",
            "--max-time",
            "20",
            "--cacert",
            &work.join("ca.pem").display().to_string(),
            "-o",
            "/dev/null",
            "-D",
            "-",
            &format!("{url}./InRelease"),
        ],
        &work,
        Duration::from_secs(30),
    );
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(head.starts_with("http/1.1 404"), "{head}");
    assert!(head.contains("content-length: 0\r\n"), "{head}");
    assert!(!head.contains("content-type"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");
}
