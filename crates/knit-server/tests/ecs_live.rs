//! Opt-in smoke test against a real Alibaba Cloud account. Never runs in
//! CI: it is ignored, and refuses to start without KNIT_ECS_LIVE=1 and a
//! real key. Run it with
//!
//! ```sh
//! KNIT_ECS_LIVE=1 ALIBABA_CLOUD_ACCESS_KEY_ID=… ALIBABA_CLOUD_ACCESS_KEY_SECRET=… \
//! KNIT_ECS_REGION=cn-shanghai KNIT_ECS_VSWITCH=vsw-… KNIT_ECS_SECURITY_GROUPS=sg-… \
//! KNIT_ECS_IMAGE=aliyun_3_x64_20G_alibase_….vhd [KNIT_ECS_INSTANCE_TYPE=ecs.g7.large] \
//! cargo test -p knit-server --test ecs_live -- --ignored --nocapture
//! ```
//!
//! It makes one instance with a 20 GiB data disk, runs a command through
//! Cloud Assistant, snapshots the data disk, and removes everything it
//! made (found by its own pool tag and snapshot name), failed or not.

use knit_server::provider::ecs::{EcsProvider, EcsSettings};
use knit_server::provider::{DiskTemplate, InstanceTemplate, Provider, TAG_NAME, TAG_POOL};
use std::time::Duration;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("the live test needs {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "live: needs KNIT_ECS_LIVE=1 and a real Alibaba Cloud key; costs money"]
async fn live_instance_command_snapshot_cleanup() {
    assert_eq!(env("KNIT_ECS_LIVE"), "1", "set KNIT_ECS_LIVE=1 to run");
    let credentials = knit_ecs::Credentials::discover().expect("a real key");
    let mut s = EcsSettings::new(&env("KNIT_ECS_REGION"));
    s.v_switch_id = Some(env("KNIT_ECS_VSWITCH"));
    s.security_group_ids = env("KNIT_ECS_SECURITY_GROUPS")
        .split(',')
        .map(str::to_string)
        .collect();
    s.default_image = Some(env("KNIT_ECS_IMAGE"));
    s.wait_limit = Duration::from_secs(900);
    let p = EcsProvider::new(s, credentials).unwrap();
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b).unwrap();
    let pool = format!("knit-smoke-{}", hex::encode(b));
    let name = format!("{pool}-0");
    let template = InstanceTemplate {
        name: name.clone(),
        instance_type: std::env::var("KNIT_ECS_INSTANCE_TYPE")
            .unwrap_or_else(|_| "ecs.g7.large".into()),
        image: "host".into(),
        system_disk_gib: 40,
        data_disks: vec![DiskTemplate {
            size_gib: 20,
            interface: "virtio".into(),
            snapshot_id: None,
        }],
        user_data: "#!/bin/sh\necho knit-smoke > /var/tmp/knit-smoke\n".into(),
        region: String::new(),
        zone: None,
        vpc: String::new(),
        tags: [
            (TAG_POOL.to_string(), pool.clone()),
            (TAG_NAME.to_string(), name.clone()),
        ]
        .into_iter()
        .collect(),
    };
    let outcome = async {
        let made = p.create(&template).await?;
        eprintln!("created {} ({:?})", made.id, made.ip);
        let (code, out, _) = p
            .exec(&made.id, &["uname".to_string(), "-a".to_string()])
            .await?;
        eprintln!("uname: {code} {}", String::from_utf8_lossy(&out));
        assert_eq!(code, 0);
        p.stop(&made.id).await?;
        let snap = p.snapshot_create(&made.id, 0, &pool).await?;
        eprintln!("snapshot {} of {} bytes", snap.id, snap.size_bytes);
        Ok::<_, knit_server::ServerError>(())
    }
    .await;
    // Clean up by tag and name whatever happened above.
    for id in p.snapshots_named(&pool).await.unwrap_or_default() {
        let gone = p.snapshot_delete(&id).await;
        eprintln!("delete snapshot {id}: {gone:?}");
    }
    for i in p.list().await.unwrap_or_default() {
        if i.tags.get(TAG_POOL) == Some(&pool) {
            let gone = p.delete(&i.id).await;
            eprintln!("delete instance {}: {gone:?}", i.id);
        }
    }
    outcome.unwrap();
}
