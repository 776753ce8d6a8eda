//! One sandbox machine of the local cloud for the agent's live tests,
//! driven through the `knit-local` CLI built beside `knit-agent`
//! (cargo build --workspace); its local cloud is brought down on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn knit_local() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_knit-agent")).with_file_name("knit-local");
    assert!(
        p.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        p.display()
    );
    p
}

/// A bridge name and a free /24 unique to this process and call.
fn unique_net(tag: &str, salt: u32, n: u32) -> (String, String) {
    let pid = std::process::id();
    let routes = Command::new("ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .expect("ip route");
    let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
    const SPACE: u32 = 100 * 256;
    let start = (pid.wrapping_mul(16).wrapping_add(n * 7919 + salt)) % SPACE;
    let prefix = (0..SPACE)
        .map(|i| (start + i) % SPACE)
        .map(|c| format!("10.{}.{}.", 150 + c / 256, c % 256))
        .find(|p| !routes.contains(p.as_str()))
        .expect("no free 10.x.y.0/24");
    (format!("{tag}{pid:x}{n}"), format!("{prefix}0/24"))
}

/// One sandbox machine in a local cloud of its own; `down` on drop.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    bridge: String,
    subnet: String,
    pub id: String,
    pub ip: String,
}

impl Sandbox {
    /// `name` names the machine and its directory; `tag` (two letters) and
    /// `salt` keep its bridge and subnet apart from other test files'.
    pub fn new(name: &str, tag: &str, salt: u32, n: u32) -> Sandbox {
        let dir = tempfile::Builder::new()
            .prefix(&format!("knit-agent-{name}-"))
            .tempdir()
            .unwrap();
        let (bridge, subnet) = unique_net(tag, salt, n);
        let mut sandbox = Sandbox {
            dir,
            bridge,
            subnet,
            id: String::new(),
            ip: String::new(),
        };
        let template = sandbox.dir.path().join("template.yaml");
        std::fs::write(&template, format!("name: {name}\nsystemDiskSize: 1Gi\n")).unwrap();
        let out = sandbox
            .local()
            .args(["create", "--file"])
            .arg(&template)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        sandbox.id = created["id"].as_str().unwrap().to_string();
        sandbox.ip = created["privateIp"]
            .as_str()
            .or_else(|| created["record"]["privateIp"].as_str())
            .unwrap_or_else(|| panic!("no privateIp in {created}"))
            .to_string();
        sandbox
    }

    pub fn local(&self) -> Command {
        let mut c = Command::new(knit_local());
        c.env("KNIT_LOCAL_STATE_DIR", self.dir.path().join("state"))
            .env("KNIT_LOCAL_BRIDGE", &self.bridge)
            .env("KNIT_LOCAL_SUBNET", &self.subnet);
        c
    }

    /// `sh -c script` inside, stdin from `input` when given.
    pub fn sh_out(&self, script: &str, input: Option<&Path>) -> Output {
        let mut c = self.local();
        c.args(["exec", &self.id, "--", "/bin/sh", "-c", script]);
        c.stdin(match input {
            Some(p) => Stdio::from(std::fs::File::open(p).unwrap()),
            None => Stdio::null(),
        });
        c.output().unwrap()
    }

    pub fn sh_bytes(&self, script: &str) -> Vec<u8> {
        let out = self.sh_out(script, None);
        assert!(
            out.status.success(),
            "`{script}` failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    pub fn sh(&self, script: &str) -> String {
        String::from_utf8_lossy(&self.sh_bytes(script)).into_owned()
    }

    pub fn copy_in(&self, from: &Path, to: &str, mode: &str) {
        let out = self.sh_out(
            &format!("mkdir -p \"$(dirname {to})\" && cat > {to} && chmod {mode} {to}"),
            Some(from),
        );
        assert!(out.status.success(), "copy {}", from.display());
    }

    /// The host's address as the machine sees it (its default gateway).
    pub fn gateway(&self) -> String {
        let route = self.sh("ip -4 route show default");
        route
            .split_whitespace()
            .skip_while(|w| *w != "via")
            .nth(1)
            .unwrap_or_else(|| panic!("no default route: {route}"))
            .to_string()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        match self.local().arg("down").output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("down: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("down: {e}"),
        }
    }
}
