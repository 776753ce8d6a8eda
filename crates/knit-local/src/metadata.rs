//! The metadata endpoint: ECS-like paths served on the bridge's gateway
//! address; the caller is identified by its source IP.

use crate::model::{DiskRecord, Instance, InstanceRecord, InstanceState};
use crate::state::StateDir;
use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Flat map of every leaf path (under `latest/`) to its value.
pub fn document(
    inst: &Instance,
    user_data: Option<&str>,
) -> Result<BTreeMap<String, String>, knit_api::ser::SerializeError> {
    let r = &inst.record;
    let a = &r.template.attributes;
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(format!("meta-data/{k}"), v);
    };
    put("instance-id", r.id.clone());
    put("region-id", a.region_id.clone());
    put("zone-id", a.zone_id.clone());
    put("private-ipv4", r.private_ip.clone());
    put("hostname", r.hostname.clone());
    put("mac", r.mac.clone());
    put("owner-account-id", a.account_id.clone());
    put("vpc-id", a.vpc_id.clone());
    put("vswitch-id", a.v_switch_id.clone());
    put("instance/instance-type", r.template.instance_type.clone());
    put(
        "instance/instance-name",
        r.template
            .name
            .clone()
            .unwrap_or_else(|| r.hostname.clone()),
    );
    put(
        "instance/max-netbw-egress",
        r.template
            .bandwidth_mbit
            .map(|b| (b * 1000).to_string())
            .unwrap_or_else(|| "0".into()),
    );
    put("image/os-id", r.os.id.clone());
    put("image/os-version", r.os.version_id.clone());
    put("network-type", "vpc".into());
    let mac = format!("meta-data/network/interfaces/macs/{}", r.mac);
    m.insert(format!("{mac}/primary-ip-address"), r.private_ip.clone());
    m.insert(format!("{mac}/vpc-id"), a.vpc_id.clone());
    m.insert(format!("{mac}/vswitch-id"), a.v_switch_id.clone());
    m.insert(
        format!("{mac}/network-interface-id"),
        format!("eni-{}", &r.id[2..]),
    );
    m.insert("meta-data/enis/count".into(), a.enis.count.to_string());
    m.insert(
        "meta-data/enis/ips-per-eni".into(),
        a.enis.ips_per_eni.to_string(),
    );
    m.insert(
        "meta-data/instance/max-enis".into(),
        a.instance_type_limits.max_enis.to_string(),
    );
    m.insert(
        "meta-data/instance/max-ips-per-eni".into(),
        a.instance_type_limits.max_ips_per_eni.to_string(),
    );
    m.insert("meta-data/ipv6-enabled".into(), a.ipv6.to_string());
    for sg in &a.security_groups {
        m.insert(
            format!("meta-data/security-groups/{}/type", sg.id),
            format!("{:?}", sg.kind).to_lowercase(),
        );
        m.insert(
            format!("meta-data/security-groups/{}/rules", sg.id),
            knit_api::ser::json("a security group's rules", &sg.rules)?,
        );
    }
    if let Some(role) = &a.ram_role {
        m.insert(
            format!("meta-data/ram/security-credentials/{role}"),
            "{\"Code\":\"Simulated\",\"Note\":\"the local cloud issues no credentials\"}".into(),
        );
    }
    for (k, v) in &a.tags {
        m.insert(format!("meta-data/tags/instance/{k}"), v.clone());
    }
    if let Some(k) = &a.login.key_pair_name {
        m.insert("meta-data/public-keys/0/key-pair-name".into(), k.clone());
    }
    for d in &inst.data_disks {
        disk(&mut m, d);
    }
    if let Some(ud) = user_data {
        m.insert("user-data".into(), ud.to_string());
    }
    Ok(m)
}

fn disk(m: &mut BTreeMap<String, String>, d: &DiskRecord) {
    let at = format!("meta-data/disks/{}", d.id);
    m.insert(format!("{at}/id"), d.id.clone());
    m.insert(format!("{at}/serial"), d.serial.clone());
    m.insert(format!("{at}/name"), d.name.clone());
    m.insert(
        format!("{at}/device"),
        d.device
            .as_ref()
            .map(|n| format!("/dev/{n}"))
            .unwrap_or_default(),
    );
    m.insert(format!("{at}/size"), d.size.to_string());
    m.insert(
        format!("{at}/interface"),
        format!("{:?}", d.interface).to_lowercase(),
    );
}

/// Answers one path: a leaf's value, or the listing of a directory.
pub fn lookup(doc: &BTreeMap<String, String>, path: &str) -> Option<String> {
    let p = path.trim_start_matches('/');
    let p = p
        .strip_prefix("latest/")
        .or_else(|| (p == "latest").then_some(""))?;
    let key = p.trim_end_matches('/');
    if let Some(v) = doc.get(key) {
        return Some(v.clone());
    }
    let prefix = if key.is_empty() {
        String::new()
    } else {
        format!("{key}/")
    };
    let mut children: Vec<String> = Vec::new();
    for k in doc.keys().filter(|k| k.starts_with(&prefix)) {
        let rest = &k[prefix.len()..];
        let child = match rest.split_once('/') {
            Some((dir, _)) => format!("{dir}/"),
            None => rest.to_string(),
        };
        if children.last() != Some(&child) {
            children.push(child);
        }
    }
    (!children.is_empty()).then(|| children.join("\n"))
}

#[derive(Clone)]
struct Ctx {
    state: StateDir,
    /// Which instance had each address at the last read of them all: a
    /// request reads its instance's one record, not every record (each a
    /// file: a thousand per request at 1,000 machines).
    by_ip: Arc<Mutex<HashMap<String, String>>>,
}

impl Ctx {
    /// The booted instance whose address is `ip`: the one the map names,
    /// checked against its record as read now; else every record read and
    /// the map made again (an address moves only with its instance gone).
    fn instance_at(&self, ip: &str) -> Option<InstanceRecord> {
        let serves = |r: &InstanceRecord| r.private_ip == ip && r.state != InstanceState::Creating;
        let known = self
            .by_ip
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(ip)
            .cloned();
        if let Some(r) = known.and_then(|id| self.state.instance(&id).ok()) {
            if serves(&r) {
                return Some(r);
            }
        }
        let records = self.state.instances().ok()?;
        *self.by_ip.lock().unwrap_or_else(|p| p.into_inner()) = records
            .iter()
            .map(|r| (r.private_ip.clone(), r.id.clone()))
            .collect();
        records.into_iter().find(serves)
    }
}

async fn handle(
    State(ctx): State<Ctx>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    uri: Uri,
) -> impl IntoResponse {
    let ip = peer.ip().to_string();
    let found = tokio::task::spawn_blocking(move || -> Option<(Instance, Option<String>)> {
        let r = ctx.instance_at(&ip)?;
        let disks = r
            .disks
            .iter()
            .filter_map(|d| ctx.state.disk(d).ok())
            .collect();
        let ud = r.template.user_data.clone();
        Some((
            Instance {
                record: r,
                data_disks: disks,
                alive: true,
            },
            ud,
        ))
    })
    .await
    .ok()
    .flatten();
    let Some((inst, ud)) = found else {
        return (
            StatusCode::FORBIDDEN,
            format!("{} is not an instance of this local cloud\n", peer.ip()),
        );
    };
    let doc = match document(&inst, ud.as_deref()) {
        Ok(doc) => doc,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    };
    match lookup(&doc, uri.path()) {
        Some(v) => (StatusCode::OK, v),
        None => (StatusCode::NOT_FOUND, format!("{} not found\n", uri.path())),
    }
}

/// Serves until the state directory's network record disappears (`down`).
pub fn serve(state_dir: PathBuf, listen: SocketAddr) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    rt.block_on(async move {
        let state = StateDir::open(&state_dir).map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let app = axum::Router::new().fallback(handle).with_state(Ctx {
            state,
            by_ip: Arc::default(),
        });
        let watch = state_dir.join("network.json");
        let gone = async move {
            while watch.exists() {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        };
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(gone)
        .await
        .map_err(|e| format!("metadata server failed: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::*;

    fn instance() -> Instance {
        let template = Template::parse("name: web-1\ninstanceType: ecs.g7.large\nattributes:\n  tags: {cluster: c1}\n  ramRole: KnitRole\n").unwrap();
        Instance {
            record: InstanceRecord {
                id: "i-0123456789ab".into(),
                hostname: "web-1".into(),
                state: InstanceState::Running,
                template,
                os: OsInfo::default(),
                private_ip: "10.213.0.2".into(),
                mac: "02:00:0a:d5:00:02".into(),
                veth: "kv0123456789ab".into(),
                netns: "knit-i-0123456789ab".into(),
                bridge: None,
                system_disk_size: 1 << 30,
                disks: vec!["d-aaaaaaaaaaaa".into()],
                init: None,
                shim: None,
                created_at: 0,
                boots: 1,
                last_boot_ms: None,
                password_set_at: None,
                cgroups: Vec::new(),
            },
            data_disks: vec![DiskRecord {
                id: "d-aaaaaaaaaaaa".into(),
                serial: "aaaaaaaaaaaa".into(),
                name: "data".into(),
                size: 1 << 30,
                interface: DiskInterface::Nvme,
                attached_to: Some("i-0123456789ab".into()),
                device: Some("nvme0n1".into()),
                from_snapshot: None,
                created_at: 0,
            }],
            alive: true,
        }
    }

    /// A request is answered for the instance that has the address now:
    /// one remembered from an earlier read is checked against its record,
    /// so an address that moved to a new instance (the old one deleted)
    /// is never answered for the old one; one being created is refused.
    #[test]
    fn an_address_is_answered_for_the_instance_that_has_it_now() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let ctx = Ctx {
            state: state.clone(),
            by_ip: Arc::default(),
        };
        let first = instance().record;
        state.put_instance(&first).unwrap();
        assert_eq!(ctx.instance_at("10.213.0.2").unwrap().id, first.id);
        assert!(ctx.instance_at("10.213.0.9").is_none(), "nobody's address");
        std::fs::remove_dir_all(state.instance_dir(&first.id)).unwrap();
        let mut second = first.clone();
        second.id = "i-ba9876543210".into();
        second.state = InstanceState::Creating;
        state.put_instance(&second).unwrap();
        assert!(
            ctx.instance_at("10.213.0.2").is_none(),
            "still being created"
        );
        second.state = InstanceState::Running;
        state.put_instance(&second).unwrap();
        assert_eq!(ctx.instance_at("10.213.0.2").unwrap().id, second.id);
    }

    #[test]
    fn paths_and_listings() {
        let doc = document(&instance(), Some("#!/bin/sh\n")).unwrap();
        assert_eq!(
            lookup(&doc, "/latest/meta-data/instance-id").unwrap(),
            "i-0123456789ab"
        );
        assert_eq!(
            lookup(&doc, "/latest/meta-data/instance/instance-type").unwrap(),
            "ecs.g7.large"
        );
        assert_eq!(
            lookup(&doc, "/latest/meta-data/private-ipv4").unwrap(),
            "10.213.0.2"
        );
        assert_eq!(
            lookup(&doc, "/latest/meta-data/disks/").unwrap(),
            "d-aaaaaaaaaaaa/"
        );
        assert_eq!(
            lookup(&doc, "/latest/meta-data/disks/d-aaaaaaaaaaaa/device").unwrap(),
            "/dev/nvme0n1"
        );
        assert_eq!(
            lookup(&doc, "/latest/meta-data/tags/instance/cluster").unwrap(),
            "c1"
        );
        assert_eq!(lookup(&doc, "/latest/user-data").unwrap(), "#!/bin/sh\n");
        let top = lookup(&doc, "/latest/").unwrap();
        assert_eq!(top, "meta-data/\nuser-data");
        assert!(lookup(&doc, "/latest/meta-data/")
            .unwrap()
            .contains("region-id"));
        assert!(lookup(&doc, "/latest/meta-data/nope").is_none());
        assert!(lookup(&doc, "/other").is_none());
    }
}
