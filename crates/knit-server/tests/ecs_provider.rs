//! The ECS provider over the fake ECS (knit-ecs's `fake`): every Provider
//! operation through signed requests, a create repeated after a crash
//! finding the instance the first one made, throttling retried, and a
//! password never in an error or a Debug text.

use knit_ecs::fake::{FakeEcs, Fault};
use knit_server::provider::ecs::{EcsProvider, EcsSettings};
use knit_server::provider::{
    DiskTemplate, InstanceTemplate, Provider, ProviderErrorKind, TAG_NAME, TAG_POOL,
};
use std::time::Duration;

fn settings(fake: &FakeEcs) -> EcsSettings {
    let mut s = EcsSettings::new(&fake.region());
    s.endpoint = Some(fake.url());
    s.v_switch_id = Some("vsw-fake0001".into());
    s.security_group_ids = vec!["sg-fake0001".into()];
    s.default_image = Some(fake.config().images[0].clone());
    s.poll_interval = Duration::from_millis(5);
    s.wait_limit = Duration::from_secs(60);
    s.retry.first_backoff = Duration::from_millis(1);
    s.retry.max_backoff = Duration::from_millis(5);
    s
}

fn provider(fake: &FakeEcs) -> EcsProvider {
    EcsProvider::new(settings(fake), fake.credentials()).unwrap()
}

fn template(name: &str, snapshot: Option<&str>) -> InstanceTemplate {
    InstanceTemplate {
        name: name.into(),
        instance_type: "ecs.g7.large".into(),
        image: "host".into(),
        system_disk_gib: 40,
        data_disks: vec![DiskTemplate {
            size_gib: 20,
            interface: "virtio".into(),
            snapshot_id: snapshot.map(str::to_string),
        }],
        user_data: "#!/bin/sh\necho first\n".into(),
        region: "cn-shanghai".into(),
        zone: None,
        vpc: "vpc-fake0001".into(),
        tags: [
            (TAG_POOL.to_string(), "workers".to_string()),
            (TAG_NAME.to_string(), name.to_string()),
        ]
        .into_iter()
        .collect(),
        light: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_over_the_fake() {
    let fake = FakeEcs::start();
    let p = provider(&fake);

    // create: RunInstances, polled through Pending and Starting.
    let made = p.create(&template("workers-aaaaa", None)).await.unwrap();
    assert_eq!(made.state, "running");
    assert_eq!(made.name.as_deref(), Some("workers-aaaaa"));
    assert!(made.ip.is_some());
    let f = fake.instance(&made.id).unwrap();
    assert_eq!(f.user_data, "#!/bin/sh\necho first\n");
    assert_eq!(f.tags[TAG_POOL], "workers");
    assert!(fake.calls("DescribeInstances") >= 4, "polled to Running");

    // get / list / find_by_name.
    assert_eq!(p.get(&made.id).await.unwrap().unwrap().id, made.id);
    assert!(p.get("i-missing").await.unwrap().is_none());
    assert_eq!(p.list().await.unwrap().len(), 1);
    assert_eq!(
        p.find_by_name("workers-aaaaa").await.unwrap().unwrap().id,
        made.id
    );
    assert!(p.find_by_name("workers-zzzzz").await.unwrap().is_none());

    // stop / start / reboot, each waiting for its state; twice is fine.
    p.stop(&made.id).await.unwrap();
    assert_eq!(fake.instance(&made.id).unwrap().status, "Stopped");
    p.stop(&made.id).await.unwrap();
    p.start(&made.id).await.unwrap();
    assert_eq!(fake.instance(&made.id).unwrap().status, "Running");
    let boots = fake.instance(&made.id).unwrap().boots;
    p.reboot(&made.id).await.unwrap();
    assert_eq!(
        fake.calls("RebootInstance"),
        1,
        "RebootInstance, not stop + start"
    );
    assert_eq!(fake.instance(&made.id).unwrap().boots, boots + 1);

    // rename: ECS's attributes, and the OS's host name. ECS gives the OS a
    // new HostName only at a start: a running instance is given it inside
    // (Cloud Assistant), without the restart that would cut off a manual
    // attach's command; a stopped one takes it when started.
    let boots = fake.instance(&made.id).unwrap().boots;
    assert_eq!(
        fake.guest_hostname(&made.id).as_deref(),
        Some("workers-aaaaa")
    );
    p.rename(&made.id, "node-1").await.unwrap();
    let f = fake.instance(&made.id).unwrap();
    assert_eq!(
        (f.name.as_str(), f.host_name.as_str()),
        ("node-1", "node-1")
    );
    assert_eq!(f.boots, boots, "renamed without a restart");
    assert_eq!(fake.guest_hostname(&made.id).as_deref(), Some("node-1"));
    let argv = |s: &str| vec!["sh".to_string(), "-c".to_string(), s.to_string()];
    let (_, out, _) = p.exec(&made.id, &argv("hostname")).await.unwrap();
    assert_eq!(out, b"node-1\n");
    p.stop(&made.id).await.unwrap();
    p.rename(&made.id, "node-2").await.unwrap();
    assert_eq!(fake.guest_hostname(&made.id).as_deref(), Some("node-1"));
    p.start(&made.id).await.unwrap();
    assert_eq!(fake.guest_hostname(&made.id).as_deref(), Some("node-2"));

    // set_password: applied by the reboot ECS needs.
    p.set_password(&made.id, "N3w-Passw0rd!").await.unwrap();
    assert_eq!(
        fake.instance(&made.id).unwrap().password.as_deref(),
        Some("N3w-Passw0rd!")
    );
    let refused = p.set_password(&made.id, "short").await.unwrap_err();
    assert!(refused.to_string().contains("InvalidPassword"), "{refused}");
    assert!(!refused.to_string().contains("short"), "{refused}");

    // exec through Cloud Assistant: exit code and both streams.
    let (code, out, err) = p
        .exec(&made.id, &argv("echo out; echo 'it''s err' >&2; exit 3"))
        .await
        .unwrap();
    // exec's limit (a day and more, for the snapshot builder's pulls) is
    // not cut short by Cloud Assistant: its largest Timeout is asked for.
    assert_eq!(fake.command_timeouts().last(), Some(&86_400));
    assert_eq!(
        (code, out.as_slice(), err.as_slice()),
        (3, &b"out\n"[..], &b"its err\n"[..])
    );
    // Output beyond Cloud Assistant's 24 KB limit comes back whole, paged.
    let (code, out, _) = p
        .exec(&made.id, &argv("head -c 70000 /dev/zero | tr '\\0' a"))
        .await
        .unwrap();
    assert_eq!(code, 0);
    assert_eq!(out, vec![b'a'; 70000]);

    // exec_limited: cut at the cap without reading the rest, and a command
    // that outlives its limit is killed inside the instance.
    let commands = fake.calls("RunCommand");
    let cut = p
        .exec_limited(
            &made.id,
            &argv("head -c 70000 /dev/zero | tr '\\0' b"),
            Duration::from_secs(60),
            1000,
        )
        .await
        .unwrap();
    assert_eq!(
        (cut.stdout.len(), cut.stdout_cut, cut.stderr_cut),
        (1000, true, false)
    );
    // The command, one chunk of stdout, stderr, the clean-up.
    assert_eq!(fake.calls("RunCommand"), commands + 4);
    let slow = p
        .exec_limited(&made.id, &argv("sleep 30"), Duration::from_secs(1), 1000)
        .await
        .unwrap_err();
    assert!(knit_server::provider::is_limit_error(&slow), "{slow}");

    // read_file: a file inside the instance larger than the output limit,
    // byte for byte.
    let file = "/var/tmp/big.log";
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fake.put_file(&made.id, file, &data).unwrap();
    let read = p.read_file(&made.id, file).await.unwrap();
    assert_eq!(read, data);
    let commands = fake.calls("RunCommand");
    let small = p
        .read_file_limited(&made.id, file, 1000, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(small.to_string().contains("larger than 1000"), "{small}");
    assert_eq!(
        fake.calls("RunCommand"),
        commands + 1,
        "stopped at the first chunk"
    );
    let missing = p
        .read_file(&made.id, "/nonexistent/knit")
        .await
        .unwrap_err();
    assert!(
        missing.to_string().contains("not a readable regular file"),
        "{missing}"
    );

    // reimage: stop, user data, new system disk, wait, start; data kept.
    let before = fake.instance(&made.id).unwrap();
    let data_disks: Vec<_> = fake
        .disks()
        .into_iter()
        .filter(|d| d.instance_id == made.id && d.kind == "data")
        .map(|d| d.id)
        .collect();
    p.reimage(&made.id, "host", "#!/bin/sh\necho second\n")
        .await
        .unwrap();
    let after = fake.instance(&made.id).unwrap();
    assert_eq!(after.status, "Running");
    assert_eq!(after.user_data, "#!/bin/sh\necho second\n");
    assert_ne!(after.system_disk, before.system_disk);
    let kept: Vec<_> = fake
        .disks()
        .into_iter()
        .filter(|d| d.instance_id == made.id && d.kind == "data")
        .map(|d| d.id)
        .collect();
    assert_eq!(kept, data_disks);
    let bad = p
        .reimage(&made.id, "/srv/images/root", "x")
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("not a directory"), "{bad}");
    assert_eq!(
        fake.instance(&made.id).unwrap().status,
        "Running",
        "untouched"
    );
    assert!(p
        .check_image("aliyun_3_x64_20G_alibase_20240819.vhd")
        .await
        .is_ok());

    // Snapshots: progressing → accomplished, found by name, used at create.
    let snap = p.snapshot_create(&made.id, 0, "0build-42").await.unwrap();
    assert_eq!(snap.size_bytes, 20 << 30);
    assert_eq!(
        p.snapshots_named("0build-42").await.unwrap(),
        vec![snap.id.clone()]
    );
    assert!(p.snapshots_named("other").await.unwrap().is_empty());
    assert!(p.snapshot_create(&made.id, 5, "x1").await.is_err());
    let from_snap = p
        .create(&template("workers-bbbbb", Some(&snap.id)))
        .await
        .unwrap();
    let disk = fake
        .disks()
        .into_iter()
        .find(|d| d.instance_id == from_snap.id && d.kind == "data")
        .unwrap();
    assert_eq!(disk.source_snapshot, snap.id);
    p.snapshot_delete(&snap.id).await.unwrap();
    p.snapshot_delete(&snap.id).await.unwrap();
    assert!(fake.snapshots().is_empty());

    // Facts for the add-existing preflight, from the API's answers.
    let existing = fake.add_existing("db-1", "ecs.g7.xlarge", Some("KnitWorkerRole"));
    let facts = p.facts(&existing).await.unwrap();
    assert_eq!(facts.account_id, fake.config().account_id);
    assert_eq!(facts.vpc_id, "vpc-fake0001");
    assert_eq!(facts.v_switch_id, "vsw-fake0001");
    assert_eq!(facts.zone_id, "cn-shanghai-b");
    assert_eq!((facts.max_enis, facts.max_ips_per_eni), (4, 15));
    assert_eq!(facts.ram_role.as_deref(), Some("KnitWorkerRole"));
    assert_eq!(facts.security_groups[0].kind, "normal");
    assert!(facts.security_groups[0]
        .rules
        .iter()
        .any(|r| r.direction == "ingress" && r.cidr.as_deref() == Some("192.168.0.0/16")));
    assert_eq!(facts.data_disks.len(), 1);
    assert_eq!(facts.data_disks[0].device.as_deref(), Some("vdb"));
    assert_eq!(facts.state, "running");
    if let Ok(release) = std::fs::read_to_string("/etc/os-release") {
        // The fake's Cloud Assistant runs on this host.
        let id_line = release
            .lines()
            .find_map(|l| l.strip_prefix("ID="))
            .unwrap_or("");
        assert_eq!(facts.os_id, id_line.trim_matches('"'));
    }

    // delete, twice.
    p.delete(&from_snap.id).await.unwrap();
    p.delete(&from_snap.id).await.unwrap();
    assert!(p.get(&from_snap.id).await.unwrap().is_none());
    assert!(fake.disks().iter().all(|d| d.instance_id != from_snap.id));
}

/// The server dies after RunInstances was carried out but before its
/// answer was recorded; the restarted server creates the same name again
/// and gets the same instance (the ClientToken comes from the name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_after_a_crash_makes_no_second_instance() {
    let fake = FakeEcs::start();
    let mut s = settings(&fake);
    s.retry.max_attempts = 1;
    let first = EcsProvider::new(s, fake.credentials()).unwrap();
    fake.inject("RunInstances", Fault::LoseAnswer, 1);
    assert!(first
        .create(&template("workers-ccccc", None))
        .await
        .is_err());
    assert_eq!(fake.instances().len(), 1);
    drop(first);

    let restarted = provider(&fake);
    let again = restarted
        .create(&template("workers-ccccc", None))
        .await
        .unwrap();
    assert_eq!(fake.instances().len(), 1);
    assert_eq!(again.id, fake.instances()[0].id);

    // The pool changed between the crash and the retry: ECS refuses the
    // token with other parameters; the instance knit named is used.
    let mut changed = template("workers-ccccc", None);
    changed.instance_type = "ecs.g7.xlarge".into();
    let same = restarted.create(&changed).await.unwrap();
    assert_eq!(same.id, again.id);
    assert_eq!(fake.instances().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_quota_and_refusals() {
    let fake = FakeEcs::start();
    let p = provider(&fake);
    fake.inject("DescribeInstances", Fault::Throttling, 3);
    assert!(p.list().await.unwrap().is_empty());

    fake.set_instance_quota(0);
    let e = p
        .create(&template("workers-ddddd", None))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("QuotaExceed.ElasticQuota"), "{e}");
    assert!(e.to_string().contains("RequestId"), "{e}");
    assert_eq!(e.provider_kind(), Some(ProviderErrorKind::Permanent), "{e}");
    fake.set_instance_quota(100);

    // A sold-out type is Capacity (the fallback's cue), by ECS's Code.
    fake.set_sold_out("ecs.g7.large", true);
    let e = p
        .create(&template("workers-eeeee", None))
        .await
        .unwrap_err();
    assert_eq!(e.provider_kind(), Some(ProviderErrorKind::Capacity), "{e}");
    assert!(e.to_string().contains("OperationDenied.NoStock"), "{e}");
    fake.set_sold_out("ecs.g7.large", false);

    let mut no_image = settings(&fake);
    no_image.default_image = None;
    let p2 = EcsProvider::new(no_image, fake.credentials()).unwrap();
    let e = p2.check_image("host").await.unwrap_err();
    assert!(e.to_string().contains("--ecs-image"), "{e}");

    // A wrong key: every call refused by the fake's signature check.
    let wrong =
        knit_ecs::Credentials::new(fake.credentials().access_key_id(), "wrong-secret", None)
            .unwrap();
    let p3 = EcsProvider::new(settings(&fake), wrong).unwrap();
    let e = p3.list().await.unwrap_err();
    assert!(e.to_string().contains("SignatureDoesNotMatch"), "{e}");
    assert_eq!(e.provider_kind(), Some(ProviderErrorKind::Auth), "{e}");
    assert!(!e.to_string().contains("wrong-secret"));
    // An unknown key's InvalidAccessKeyId.NotFound is not "already
    // deleted": delete and snapshot_delete fail, naming ECS's code.
    let unknown = knit_ecs::Credentials::new("LTAIunknown", "x", None).unwrap();
    let p4 = EcsProvider::new(settings(&fake), unknown).unwrap();
    let e = p4.delete("i-fake000000000001").await.unwrap_err();
    assert!(e.to_string().contains("InvalidAccessKeyId.NotFound"), "{e}");
    assert_eq!(e.provider_kind(), Some(ProviderErrorKind::Auth), "{e}");
    let e = p4.snapshot_delete("s-fake000000000001").await.unwrap_err();
    assert!(e.to_string().contains("InvalidAccessKeyId.NotFound"), "{e}");
    // A snapshot or instance that is gone is: deleting it again is done.
    p.delete("i-fake00000000ffff").await.unwrap();
    p.snapshot_delete("s-fake00000000ffff").await.unwrap();

    // Throttled past the client's retries stays Throttled (last: the
    // injected faults outlast this test).
    fake.inject("DescribeInstances", Fault::Throttling, 100);
    let e = p.list().await.unwrap_err();
    assert_eq!(e.provider_kind(), Some(ProviderErrorKind::Throttled), "{e}");
}
