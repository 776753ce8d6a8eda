//! One conformance suite for every provider that exists: the same
//! operations and the same expectations (the crash contract included: a
//! created instance is found again by knit's name) against the ECS provider
//! over the fake ECS, against the local cloud and against QEMU VMs (one boot
//! under TCG, about a minute; it needs the node OS image, `knit image build`).

use knit_server::provider::ecs::{EcsProvider, EcsSettings};
use knit_server::provider::{DiskTemplate, InstanceTemplate, Provider, TAG_NAME, TAG_POOL};
use std::path::PathBuf;
use std::time::Duration;

fn template(name: &str) -> InstanceTemplate {
    InstanceTemplate {
        name: name.into(),
        instance_type: "ecs.g7.large".into(),
        image: "host".into(),
        system_disk_gib: 40,
        data_disks: vec![DiskTemplate {
            size_gib: 1,
            interface: "virtio".into(),
            snapshot_id: None,
        }],
        user_data: "#!/bin/sh\ntrue\n".into(),
        region: "cn-shanghai".into(),
        zone: None,
        vpc: "vpc-fake0001".into(),
        tags: [
            (TAG_POOL.to_string(), "conformance".to_string()),
            (TAG_NAME.to_string(), name.to_string()),
        ]
        .into_iter()
        .collect(),
        light: false,
    }
}

fn argv(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// What every provider must do. `boot`: how long a new instance may take
/// before it runs commands (a VM under TCG boots for a minute or more, and
/// longer beside other tests); the first `exec` is retried until then, and
/// its last error is the failure.
async fn conformance(p: &dyn Provider, name: &str, boot: Duration) {
    // An image that cannot exist is refused before anything is made.
    assert!(p.check_image("/nonexistent/knit-image").await.is_err());

    let made = p.create(&template(name)).await.unwrap();
    assert!(made.state.eq_ignore_ascii_case("running"), "{made:?}");
    assert_eq!(made.name.as_deref(), Some(name));
    assert!(made.ip.is_some());
    // The crash contract: found again by knit's name, by id, in the list.
    assert_eq!(p.find_by_name(name).await.unwrap().unwrap().id, made.id);
    assert_eq!(p.get(&made.id).await.unwrap().unwrap().id, made.id);
    assert!(p.list().await.unwrap().iter().any(|i| i.id == made.id));

    let deadline = std::time::Instant::now() + boot;
    let (code, out, err) = loop {
        match p
            .exec(&made.id, &argv("echo out; echo err >&2; exit 3"))
            .await
        {
            Ok(done) => break done,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("{name}: not running commands yet: {e}");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Err(e) => panic!("{name}: exec after {} s: {e}", boot.as_secs()),
        }
    };
    assert_eq!(
        (code, out.as_slice(), err.as_slice()),
        (3, &b"out\n"[..], &b"err\n"[..])
    );
    let file = format!("/tmp/knit-conformance-{name}");
    let (code, _, _) = p
        .exec(&made.id, &argv(&format!("printf knit > {file}")))
        .await
        .unwrap();
    assert_eq!(code, 0);
    assert_eq!(p.read_file(&made.id, &file).await.unwrap(), b"knit");
    let (code, _, _) = p
        .exec(&made.id, &argv(&format!("rm -f {file}")))
        .await
        .unwrap();
    assert_eq!(code, 0);

    p.rename(&made.id, &format!("{name}-r")).await.unwrap();
    assert_eq!(p.find_by_name(name).await.unwrap().unwrap().id, made.id);

    p.stop(&made.id).await.unwrap();
    let stopped = p.get(&made.id).await.unwrap().unwrap();
    assert!(stopped.state.eq_ignore_ascii_case("stopped"), "{stopped:?}");
    let snap = p
        .snapshot_create(&made.id, 0, &format!("conf-{name}"))
        .await
        .unwrap();
    assert!(snap.size_bytes > 0);
    assert_eq!(
        p.snapshots_named(&format!("conf-{name}")).await.unwrap(),
        vec![snap.id.clone()]
    );
    p.start(&made.id).await.unwrap();
    let started = p.get(&made.id).await.unwrap().unwrap();
    assert!(started.state.eq_ignore_ascii_case("running"), "{started:?}");

    p.delete(&made.id).await.unwrap();
    assert!(p.get(&made.id).await.unwrap().is_none());
    assert!(p.find_by_name(name).await.unwrap().is_none());
    p.snapshot_delete(&snap.id).await.unwrap();
    assert!(p
        .snapshots_named(&format!("conf-{name}"))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecs_over_the_fake() {
    let fake = knit_ecs::fake::FakeEcs::start();
    let mut s = EcsSettings::new(&fake.region());
    s.endpoint = Some(fake.url());
    s.v_switch_id = Some("vsw-fake0001".into());
    s.security_group_ids = vec!["sg-fake0001".into()];
    s.default_image = Some(fake.config().images[0].clone());
    s.poll_interval = Duration::from_millis(5);
    s.retry.first_backoff = Duration::from_millis(1);
    let p = EcsProvider::new(s, fake.credentials()).unwrap();
    conformance(&p, "conf-ecs", Duration::ZERO).await;
}

/// The local cloud's helper binary, next to this test's own directory.
fn local_helper() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let helper = exe.parent()?.parent()?.join("knit-local");
    helper.exists().then_some(helper)
}

/// A 10.2xx.y.0/24 no host route uses, starting from the pid.
fn free_subnet(pid: u32) -> String {
    let routes = std::process::Command::new("ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .unwrap();
    let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
    (0..50 * 256u32)
        .map(|i| (pid + i) % (50 * 256))
        .map(|c| format!("10.{}.{}.", 200 + c / 256, c % 256))
        .find(|prefix| !routes.contains(prefix.as_str()))
        .map(|prefix| format!("{prefix}0/24"))
        .unwrap()
}

/// Takes the local cloud down (bridge, namespaces, mounts) on drop.
struct Down(knit_local::Cloud);

impl Drop for Down {
    fn drop(&mut self) {
        match self.0.down() {
            Ok(r) if r.errors.is_empty() => {}
            Ok(r) => eprintln!("down left errors: {:?}", r.errors),
            Err(e) => eprintln!("down failed: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cloud() {
    let Some(helper) = local_helper() else {
        return knit_test_support::missing(
            "no knit-local binary next to the tests (cargo build -p knit-local)",
        );
    };
    let tmp = tempfile::Builder::new()
        .prefix("knit-conformance-")
        .tempdir()
        .unwrap();
    let pid = std::process::id();
    let config = knit_local::Config {
        state_dir: tmp.path().join("local"),
        bridge: format!("kc{pid:x}"),
        subnet: free_subnet(pid),
        metadata_port: 80,
        helper: Some(helper),
    };
    let _down = Down(knit_local::Cloud::open(config.clone()).unwrap());
    let p = knit_server::provider::local::LocalProvider::new(config).unwrap();
    conformance(&p, "conf-local", Duration::ZERO).await;
}

/// The local cloud's exec through the control plane's bounded provider, in
/// a real instance: an endless stream is cut at the cap (exit code kept);
/// a command past its limit is a ProviderTimeout and is killed inside the
/// instance too (`timeout -s KILL` there), not left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_exec_is_bounded_inside_the_instance() {
    use knit_server::provider::{BoundedProvider, CallLimits};
    let Some(helper) = local_helper() else {
        return knit_test_support::missing(
            "no knit-local binary next to the tests (cargo build -p knit-local)",
        );
    };
    let tmp = tempfile::Builder::new()
        .prefix("knit-exec-bound-")
        .tempdir()
        .unwrap();
    let pid = std::process::id();
    let config = knit_local::Config {
        state_dir: tmp.path().join("local"),
        bridge: format!("kb{pid:x}"),
        subnet: free_subnet(pid),
        metadata_port: 80,
        helper: Some(helper),
    };
    let _down = Down(knit_local::Cloud::open(config.clone()).unwrap());
    let local = knit_server::provider::local::LocalProvider::new(config).unwrap();
    let p = BoundedProvider::new(
        std::sync::Arc::new(local),
        CallLimits {
            exec_output_max: 1 << 20,
            ..CallLimits::default()
        },
    );
    let made = p.create(&template("exec-bound")).await.unwrap();

    let (code, out, _) = p
        .exec(&made.id, &argv("head -c 50000000 /dev/zero; exit 4"))
        .await
        .unwrap();
    assert_eq!(code, 4);
    let marker = knit_server::provider::EXEC_CUT_MARKER.as_bytes();
    assert_eq!(out.len(), (1 << 20) + marker.len());
    assert!(out.ends_with(marker));

    let e = p
        .exec_limited(
            &made.id,
            &argv("sleep 7 && touch /tmp/knit-survived"),
            Duration::from_secs(1),
            1024,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "ProviderTimeout", "{e}");
    // Past the inner kill (limit + 2 s) and the sleep: nothing was left to
    // finish it.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let (code, _, _) = p
        .exec(&made.id, &argv("test ! -e /tmp/knit-survived"))
        .await
        .unwrap();
    assert_eq!(
        code, 0,
        "the command outlived its limit inside the instance"
    );
    p.delete(&made.id).await.unwrap();
}

/// Brings the VMs down (processes, taps, files), then the local cloud's
/// network they used, on drop.
struct VmsDown {
    qemu: knit_qemu::Config,
    _local: Down,
}

impl Drop for VmsDown {
    fn drop(&mut self) {
        if self.qemu.state_dir.exists() {
            match knit_qemu::Machines::open(self.qemu.clone()).and_then(|m| m.down()) {
                Ok(r) if !r.vms.is_empty() => eprintln!("VMs left, now down: {r:?}"),
                Ok(_) => {}
                Err(e) => eprintln!("VMs down failed: {e}"),
            }
        }
    }
}

/// QEMU VMs on a bridge of their own: the node OS image (`knit image
/// build`), TCG on a host without usable KVM. The VM boots while `create`
/// returns; the first `exec` waits for its guest agent (52 s in all here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_vms() {
    let Some(helper) = local_helper() else {
        panic!("no knit-local binary next to the tests (cargo build -p knit-local)");
    };
    let qemu_installed = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("qemu-system-x86_64").is_file()));
    assert!(
        qemu_installed,
        "qemu-system-x86_64 is missing: scripts/setup.sh installs it"
    );
    let image = knit_local::image::images_dir().join(knit_local::image::NAME);
    assert!(
        knit_qemu::base::check_image(&image).is_ok(),
        "no node OS image at {}: run `knit image build`",
        image.display()
    );
    let tmp = tempfile::Builder::new()
        .prefix("knit-conformance-qemu-")
        .tempdir()
        .unwrap();
    let pid = std::process::id();
    let local = knit_local::Config {
        state_dir: tmp.path().join("local"),
        bridge: format!("kv{pid:x}"),
        subnet: free_subnet(pid),
        metadata_port: 80,
        helper: Some(helper),
    };
    let qemu = knit_qemu::Config {
        state_dir: tmp.path().join("qemu"),
        bridge: local.bridge.clone(),
        subnet: local.subnet.clone(),
        ..knit_qemu::Config::default()
    };
    let _down = VmsDown {
        qemu: qemu.clone(),
        _local: Down(knit_local::Cloud::open(local.clone()).unwrap()),
    };
    let p = knit_server::provider::qemu::QemuProvider::new(local, qemu.clone()).unwrap();
    conformance(&p, "conf-qemu", Duration::from_secs(900)).await;
    // Nothing of the VM is left: no tap on the bridge, no VM directory.
    let ports: Vec<_> = std::fs::read_dir(format!("/sys/class/net/{}/brif", qemu.bridge))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(ports.is_empty(), "ports left on {}: {ports:?}", qemu.bridge);
    let vms = qemu.state_dir.join("vms");
    let left: Vec<_> = std::fs::read_dir(&vms)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left under {}: {left:?}", vms.display());
}
