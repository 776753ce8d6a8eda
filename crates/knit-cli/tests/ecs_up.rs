//! `knit up --provider ecs` against the stateful fake ECS (issue 28, item
//! 9): every ECS flag given to `knit up` reaches the server it starts (a
//! pool's replica becomes an ECS instance in the fake's region, vSwitch,
//! security group and image); a missing ECS setting stops `knit up`
//! naming the flag; an ECS image id is a valid `spec.image`; a pool whose
//! creates keep failing says why in `knit get pools` and `knit describe
//! pool`. The server is a real `knit server` process (TLS, SQLite); no
//! root, no local cloud. Its state lives in a temporary directory and the
//! server is stopped (`knit down`, else by its recorded pid) on success,
//! failure and panic.

use knit_ecs::fake::{FakeConfig, FakeEcs, Fault};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn knit_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_knit"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `knit up` of the ECS provider: its directory, the fake's key in
/// the environment, the server stopped on drop.
struct Up {
    dir: tempfile::TempDir,
    fake: FakeEcs,
    port: u16,
}

impl Up {
    fn new() -> Up {
        let fake = FakeEcs::start_with(FakeConfig {
            polls_per_state: 1,
            ..FakeConfig::default()
        });
        let dir = tempfile::tempdir().unwrap();
        // A mirror already assembled (the agent and its digest): `knit up`
        // then builds none, and user data names the digest.
        let bin = dir.path().join("state/mirror/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("knit-agent"), b"agent").unwrap();
        std::fs::write(
            bin.join("knit-agent.sha256"),
            format!("{}  knit-agent\n", "ab".repeat(32)),
        )
        .unwrap();
        Up {
            dir,
            fake,
            port: free_port(),
        }
    }

    fn knit(&self, args: &[&str]) -> Output {
        let key = self.fake.config();
        let mut cmd = Command::new(knit_bin());
        cmd.arg("--config")
            .arg(self.dir.path().join("config"))
            .args(args)
            .env("ALIBABA_CLOUD_ACCESS_KEY_ID", &key.access_key_id)
            .env("ALIBABA_CLOUD_ACCESS_KEY_SECRET", &key.access_key_secret)
            .env_remove("ALIBABA_CLOUD_SECURITY_TOKEN")
            .env("HOME", self.dir.path())
            .stdin(Stdio::null());
        // No KNIT_* setting of the caller's environment leaks in.
        for (k, _) in std::env::vars() {
            if k.starts_with("KNIT_") {
                cmd.env_remove(k);
            }
        }
        cmd.output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.knit(args);
        assert!(
            out.status.success(),
            "knit {} failed:\n{}\n{}\nserver log:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.server_log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("state/server.log")).unwrap_or_default()
    }

    /// `knit up` with every ECS flag (`extra` appended), or without the
    /// ones named in `leave_out`.
    fn up_args(&self, leave_out: &[&str]) -> Vec<String> {
        let cfg = self.fake.config();
        let state = self.dir.path().join("state").display().to_string();
        let mut args: Vec<String> = vec![
            "up".into(),
            "--state-dir".into(),
            state,
            "--local-state-dir".into(),
            self.dir.path().join("local").display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.port),
            "--cluster".into(),
            "none".into(),
            "--console-listen".into(),
            "off".into(),
            "--provider".into(),
            "ecs".into(),
        ];
        for (flag, value) in [
            ("--region", cfg.region.clone()),
            ("--ecs-endpoint", self.fake.url()),
            ("--ecs-vswitch", "vsw-fake0001".to_string()),
            ("--ecs-security-group", "sg-fake0001".to_string()),
            ("--ecs-image", cfg.images[0].clone()),
        ] {
            if !leave_out.contains(&flag) {
                args.push(flag.into());
                args.push(value);
            }
        }
        args
    }

    fn pool_instances(&self, pool: &str) -> Vec<knit_ecs::fake::FakeInstance> {
        self.fake
            .instances()
            .into_iter()
            .filter(|i| {
                i.tags
                    .get(knit_server::provider::TAG_POOL)
                    .map(String::as_str)
                    == Some(pool)
            })
            .collect()
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.knit(&["down", "--timeout", "60"]);
        // A server `knit down` could not stop: by the pid `knit up` recorded.
        if let Ok(text) = std::fs::read_to_string(self.dir.path().join("config")) {
            if let Some(pid) = serde_yaml_ng::from_str::<Value>(&text)
                .ok()
                .and_then(|c| c["pid"].as_u64())
            {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                if String::from_utf8_lossy(&cmdline).contains(&*self.dir.path().to_string_lossy()) {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                }
            }
        }
    }
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn knit_up_starts_ecs_with_every_flag_and_says_why_creates_fail() {
    let up = Up::new();
    let cfg = up.fake.config();

    // Each ECS setting left out stops `knit up` naming its flag, and no
    // server is left running.
    for flag in ["--ecs-vswitch", "--ecs-security-group", "--ecs-image"] {
        let args = up.up_args(&[flag]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = up.knit(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "knit up without {flag} started");
        assert!(err.contains(flag), "{flag} not named: {err}");
    }
    let args = up.up_args(&["--region"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = String::from_utf8_lossy(&up.knit(&args).stderr).into_owned();
    assert!(err.contains("--region"), "{err}");

    // Every flag given: the server runs the ECS provider against the fake.
    let args = up.up_args(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    up.ok(&args);
    let pool = write(
        up.dir.path(),
        "pool.yaml",
        "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: ecs-up}\nspec:\n  replicas: 1\n",
    );
    up.ok(&["apply", "-f", &pool]);
    wait_for(
        "an ECS instance of the pool",
        Duration::from_secs(120),
        || {
            up.pool_instances("ecs-up")
                .iter()
                .any(|i| i.status == "Running")
        },
    );
    let made = up.pool_instances("ecs-up");
    assert_eq!(made.len(), 1, "{made:?}");
    // --ecs-image stands for the pool's debian-12.
    assert_eq!(made[0].image, cfg.images[0]);

    // An ECS image id is a valid spec.image on ECS.
    let named = write(
        up.dir.path(),
        "named.yaml",
        &format!(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {{name: ecs-image}}\nspec:\n  replicas: 1\n  image: {}\n",
            cfg.images[cfg.images.len() - 1]
        ),
    );
    up.ok(&["apply", "-f", &named]);
    wait_for(
        "an instance of the named image",
        Duration::from_secs(120),
        || {
            up.pool_instances("ecs-image")
                .iter()
                .any(|i| i.status == "Running" && i.image == cfg.images[cfg.images.len() - 1])
        },
    );

    // Creates that keep failing: the reason is in get pools and describe.
    up.fake.inject("RunInstances", Fault::ServerError, 1000);
    up.ok(&["scale", "pool", "ecs-up", "--replicas", "2"]);
    wait_for("the pool's create error", Duration::from_secs(120), || {
        up.json(&["get", "pool", "ecs-up", "-o", "json"])["status"]["createError"]
            .as_str()
            .is_some()
    });
    let view = up.json(&["get", "pool", "ecs-up", "-o", "json"]);
    let why = view["status"]["createError"].as_str().unwrap();
    assert!(why.contains("create attempt"), "{why}");
    let table = up.ok(&["get", "pools"]);
    assert!(table.lines().next().unwrap().contains("MESSAGE"), "{table}");
    assert!(table.contains("create attempt"), "{table}");
    let described = up.ok(&["describe", "pool", "ecs-up"]);
    assert!(described.contains("createError"), "{described}");
}

#[test]
fn a_local_cloud_server_refuses_an_ecs_image_id() {
    // The pool's image is checked by the provider that will use it.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("config");
    let mut server = Command::new(knit_bin())
        .arg("--config")
        .arg(&config)
        .args([
            "server",
            "--write-config",
            "--provider",
            "local",
            "--cluster",
            "none",
        ])
        .args([
            "--console-listen",
            "off",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--local-state-dir")
        .arg(dir.path().join("local"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let knit = |args: &[&str]| {
        Command::new(knit_bin())
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap()
    };
    let ready = (0..150).any(|_| {
        std::thread::sleep(Duration::from_millis(200));
        config.exists() && knit(&["get", "pools"]).status.success()
    });
    let pool = write(
        dir.path(),
        "pool.yaml",
        "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: wrong-image}\nspec:\n  replicas: 0\n  image: aliyun_3_x64_20G_alibase_20240819.vhd\n",
    );
    let out = knit(&["apply", "-f", &pool]);
    let _ = server.kill();
    let _ = server.wait();
    assert!(ready, "the server did not answer");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "an ECS image id was accepted on the local cloud"
    );
    assert!(err.contains("spec.image"), "{err}");
}
