//! cluster-autoscaler's externalgrpc contract, driven by a Rust gRPC client
//! generated from the same proto the server serves, over real mutual TLS
//! on loopback, against a real server (SQLite store, reconciler, intents,
//! drain) whose provider makes instances at once (or refuses them for want
//! of stock while told to).
//!
//! An auto-scaling pool goes 0 → 2 → 1 through every call: a client with no
//! certificate, or one from another CA, is refused; the template node
//! decodes as a v1.Node with the instance type's capacity; a create
//! refused for capacity shows as out-of-resources and is taken back with
//! NodeGroupDecreaseTargetSize; increases past max, decreases of made
//! nodes and deletes of another pool's node are refused with nothing
//! changed; NodeGroupDeleteNodes drains and releases exactly the node named.

mod support;

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use knit_server::autoscaler::proto::externalgrpc as pb;
use knit_server::autoscaler::proto::k8s::io::api::core::v1 as core;
use knit_server::autoscaler::AutoscalerSettings;
use knit_server::provider::{InstanceTemplate, Provider, ProviderInstance, ProviderSnapshot};
use knit_server::ServerError;
use pb::cloud_provider_client::CloudProviderClient;
use pb::instance_status::InstanceState;
use prost::Message;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::TestServer;
use tonic::transport::{Channel, Endpoint, Uri};

type Result<T> = std::result::Result<T, ServerError>;

/// Makes instances at once (running, `i-1`, `i-2` …), or refuses every
/// create with ECS's out-of-stock error while `no_stock` is set.
#[derive(Default)]
struct MakingCloud {
    next: AtomicUsize,
    no_stock: AtomicBool,
    /// Types out of stock even while `no_stock` is not set.
    no_stock_types: Mutex<std::collections::BTreeSet<String>>,
    /// (instance name, type) of each instance made.
    made: Mutex<Vec<(String, String)>>,
    instances: Mutex<BTreeMap<String, ProviderInstance>>,
    deleted: Mutex<Vec<String>>,
}

fn fail(message: &str) -> ServerError {
    ServerError::from(knit_server::provider::ProviderError::failed(
        "making", message,
    ))
}

#[async_trait]
impl Provider for MakingCloud {
    fn name(&self) -> &str {
        "making"
    }
    async fn create(&self, t: &InstanceTemplate) -> Result<ProviderInstance> {
        if self.no_stock.load(Ordering::SeqCst)
            || self
                .no_stock_types
                .lock()
                .unwrap()
                .contains(&t.instance_type)
        {
            // ECS's provider maps this Code to the Capacity kind.
            return Err(knit_server::provider::ProviderError::new(
                "making",
                knit_server::provider::ProviderErrorKind::Capacity,
                "OperationDenied.NoStock",
                format!(
                    "RunInstances: OperationDenied.NoStock: the resource {} is out of stock in this zone",
                    t.instance_type
                ),
            )
            .into());
        }
        let n = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let i = ProviderInstance {
            id: format!("i-{n}"),
            name: Some(t.name.clone()),
            state: "Running".into(),
            ip: Some(format!("10.0.0.{n}")),
            tags: BTreeMap::new(),
        };
        self.instances
            .lock()
            .unwrap()
            .insert(i.id.clone(), i.clone());
        self.made
            .lock()
            .unwrap()
            .push((t.name.clone(), t.instance_type.clone()));
        Ok(i)
    }
    async fn get(&self, id: &str) -> Result<Option<ProviderInstance>> {
        Ok(self.instances.lock().unwrap().get(id).cloned())
    }
    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        Ok(self.instances.lock().unwrap().values().cloned().collect())
    }
    async fn start(&self, _: &str) -> Result<()> {
        Ok(())
    }
    async fn stop(&self, _: &str) -> Result<()> {
        Ok(())
    }
    async fn reimage(&self, _: &str, _: &str, _: &str) -> Result<()> {
        Err(fail("reimage is not part of this test"))
    }
    async fn check_image(&self, _: &str) -> Result<()> {
        Ok(())
    }
    async fn rename(&self, _: &str, _: &str) -> Result<()> {
        Ok(())
    }
    async fn set_password(&self, _: &str, _: &str) -> Result<()> {
        Ok(())
    }
    async fn delete(&self, id: &str) -> Result<()> {
        self.instances.lock().unwrap().remove(id);
        self.deleted.lock().unwrap().push(id.to_string());
        Ok(())
    }
    async fn read_file(&self, _: &str, _: &str) -> Result<Vec<u8>> {
        Err(fail("read_file is not part of this test"))
    }
    async fn snapshot_create(&self, _: &str, _: usize, _: &str) -> Result<ProviderSnapshot> {
        Err(fail("snapshots are not part of this test"))
    }
    async fn snapshot_delete(&self, _: &str) -> Result<()> {
        Err(fail("snapshots are not part of this test"))
    }
}

/// A client certificate and key (PEM) from a CA knit never saw.
fn foreign_identity() -> (String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "knit control plane CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        knit_server::autoscaler::CLIENT_CN,
    );
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A gRPC client over TLS to `addr`, trusting `ca_pem`, presenting
/// `identity` (certificate, key) when given. Errors as text: a refused
/// handshake may show at connect or at the first call.
async fn connect(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<&(String, String)>,
) -> std::result::Result<CloudProviderClient<Channel>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<std::result::Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let channel = Endpoint::from_static("http://knit-autoscaler")
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    Ok(CloudProviderClient::new(channel))
}

fn node(provider_id: &str) -> pb::ExternalGrpcNode {
    pb::ExternalGrpcNode {
        provider_id: provider_id.to_string(),
        ..Default::default()
    }
}

const AUTO: &str = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: auto\nspec:\n  type: auto-scaling\n  replicas: 0\n  scaling: {min: 0, max: 2, scaleDownUnneededSeconds: 300, scaleDownUtilizationThreshold: 0.6}\n  instanceTypes: [ecs.g7.large, ecs.c7.xlarge]\n  labels: {tier: web}\n  taints: [{key: dedicated, value: web, effect: NoSchedule}]\n  kubelet: {maxPods: 64, kubeReserved: {cpu: 100m, memory: 512Mi}}\n";
const FIXED: &str = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: fixed\nspec:\n  replicas: 1\n";

#[test]
fn an_auto_scaling_pool_driven_through_every_call() {
    let cloud = Arc::new(MakingCloud::default());
    let mut ts = TestServer::new();
    ts.settings.autoscaler = Some(AutoscalerSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        required: true,
    });
    ts.start(Some(cloud.clone()));
    ts.write_agent_checksum();
    let addr = ts.server().autoscaler_addr.expect("the service listens");
    let ca = ts.server().ca_pem().to_string();
    let region = ts.server().control.cluster_doc().unwrap().spec.region;
    // What `knit autoscaler cloud-config` asks for: a certificate from
    // knit's CA, the CA, and the service's address.
    let issued = ts
        .client()
        .call("POST", "/api/v1/autoscaler/client-certificate", Some("{}"))
        .unwrap();
    assert_eq!(issued["address"].as_str(), Some(addr.to_string().as_str()));
    assert_eq!(issued["ca"].as_str(), Some(ca.as_str()));
    let identity = (
        issued["certificate"].as_str().unwrap().to_string(),
        issued["key"].as_str().unwrap().to_string(),
    );
    ts.client()
        .call("POST", "/api/v1/pools", Some(AUTO))
        .unwrap();
    ts.client()
        .call("POST", "/api/v1/pools", Some(FIXED))
        .unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();

    // Mutual TLS: no certificate, or one of another CA, gets nothing.
    for (what, id) in [
        ("no certificate", None),
        ("a foreign CA's", Some(foreign_identity())),
    ] {
        let refused = rt.block_on(async {
            match connect(addr, &ca, id.as_ref()).await {
                Err(e) => e,
                Ok(mut c) => match c.node_groups(pb::NodeGroupsRequest {}).await {
                    Err(status) => format!("call: {status:?}"),
                    Ok(answer) => panic!("{what}: served {answer:?}"),
                },
            }
        });
        assert!(!refused.is_empty(), "{what}");
    }
    let mut c = rt.block_on(connect(addr, &ca, Some(&identity))).unwrap();

    // NodeGroups: the auto-scaling pool only.
    let groups = rt
        .block_on(c.node_groups(pb::NodeGroupsRequest {}))
        .unwrap()
        .into_inner()
        .node_groups;
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(
        (
            groups[0].id.as_str(),
            groups[0].min_size,
            groups[0].max_size
        ),
        ("auto", 0, 2)
    );
    let target = |c: &mut CloudProviderClient<Channel>| {
        rt.block_on(c.node_group_target_size(pb::NodeGroupTargetSizeRequest { id: "auto".into() }))
            .unwrap()
            .into_inner()
            .target_size
    };
    assert_eq!(target(&mut c), 0);
    let unknown = rt
        .block_on(c.node_group_target_size(pb::NodeGroupTargetSizeRequest { id: "fixed".into() }))
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");

    // The template node: a v1.Node of the first type, ecs.g7.large.
    let bytes = rt
        .block_on(
            c.node_group_template_node_info(pb::NodeGroupTemplateNodeInfoRequest {
                id: "auto".into(),
            }),
        )
        .unwrap()
        .into_inner()
        .node_bytes;
    let template = core::Node::decode(bytes.as_slice()).unwrap();
    let labels = &template.metadata.as_ref().unwrap().labels;
    assert_eq!(labels["node.kubernetes.io/instance-type"], "ecs.g7.large");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    assert_eq!(labels["knit.dev/pool"], "auto");
    assert_eq!(labels["tier"], "web");
    let status = template.status.as_ref().unwrap();
    let q = |m: &BTreeMap<String, _>, k: &str| {
        let v: &knit_server::autoscaler::proto::k8s::io::apimachinery::pkg::api::resource::Quantity =
            &m[k];
        v.string.clone().unwrap()
    };
    assert_eq!(q(&status.capacity, "cpu"), "2");
    assert_eq!(q(&status.capacity, "memory"), "8Gi");
    assert_eq!(q(&status.capacity, "pods"), "64");
    assert_eq!(q(&status.capacity, "ephemeral-storage"), "40Gi");
    assert_eq!(q(&status.allocatable, "cpu"), "1900m");
    // 8 GiB less 512 MiB reserved and the 300 MiB hard eviction threshold.
    assert_eq!(q(&status.allocatable, "memory"), "7380Mi");
    let taints = &template.spec.as_ref().unwrap().taints;
    assert_eq!(taints[0].key.as_deref(), Some("dedicated"));

    let nodes = |c: &mut CloudProviderClient<Channel>| {
        rt.block_on(c.node_group_nodes(pb::NodeGroupNodesRequest { id: "auto".into() }))
            .unwrap()
            .into_inner()
            .instances
    };
    let wait_for = |c: &mut CloudProviderClient<Channel>,
                    what: &str,
                    done: &dyn Fn(&[pb::Instance]) -> bool|
     -> Vec<pb::Instance> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let now = nodes(c);
            if done(&now) {
                return now;
            }
            assert!(Instant::now() < deadline, "{what}: {now:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    // A scale-up the cloud has no stock for: out of resources, then taken
    // back while nothing was made.
    cloud.no_stock.store(true, Ordering::SeqCst);
    rt.block_on(
        c.node_group_increase_size(pb::NodeGroupIncreaseSizeRequest {
            id: "auto".into(),
            delta: 1,
        }),
    )
    .unwrap();
    assert_eq!(target(&mut c), 1);
    let stuck = wait_for(&mut c, "the create refused for stock", &|n| {
        n.len() == 1
            && n[0]
                .status
                .as_ref()
                .and_then(|s| s.error_info.as_ref())
                .is_some()
    });
    let status = stuck[0].status.clone().unwrap();
    assert_eq!(
        status.instance_state,
        InstanceState::InstanceCreating as i32
    );
    let info = status.error_info.unwrap();
    assert_eq!(info.instance_error_class, 1, "{info:?}");
    assert_eq!(info.error_code, "OutOfResources");
    assert!(info.error_message.contains("NoStock"), "{info:?}");
    assert!(stuck[0].id.starts_with("knit://auto-"), "{stuck:?}");
    rt.block_on(
        c.node_group_decrease_target_size(pb::NodeGroupDecreaseTargetSizeRequest {
            id: "auto".into(),
            delta: -1,
        }),
    )
    .unwrap();
    assert_eq!(target(&mut c), 0);
    wait_for(&mut c, "the unmade instance gone", &|n| n.is_empty());
    cloud.no_stock.store(false, Ordering::SeqCst);

    // Increase: past max refused, nothing changed; a delta of 0 is invalid.
    let over = rt
        .block_on(
            c.node_group_increase_size(pb::NodeGroupIncreaseSizeRequest {
                id: "auto".into(),
                delta: 3,
            }),
        )
        .unwrap_err();
    assert_eq!(over.code(), tonic::Code::FailedPrecondition, "{over:?}");
    assert!(over.message().contains("max 2"), "{over:?}");
    let zero = rt
        .block_on(
            c.node_group_increase_size(pb::NodeGroupIncreaseSizeRequest {
                id: "auto".into(),
                delta: 0,
            }),
        )
        .unwrap_err();
    assert_eq!(zero.code(), tonic::Code::InvalidArgument, "{zero:?}");
    assert_eq!(target(&mut c), 0);

    // 0 → 2.
    rt.block_on(
        c.node_group_increase_size(pb::NodeGroupIncreaseSizeRequest {
            id: "auto".into(),
            delta: 2,
        }),
    )
    .unwrap();
    assert_eq!(target(&mut c), 2);
    let running = wait_for(&mut c, "two running instances", &|n| {
        n.len() == 2
            && n.iter().all(|i| {
                i.status.as_ref().map(|s| s.instance_state)
                    == Some(InstanceState::InstanceRunning as i32)
            })
    });
    let ids: Vec<String> = running.iter().map(|i| i.id.clone()).collect();
    for id in &ids {
        assert!(id.starts_with(&format!("{region}.i-")), "{id}");
    }

    // Made nodes are not taken back by a decrease.
    let made = rt
        .block_on(
            c.node_group_decrease_target_size(pb::NodeGroupDecreaseTargetSizeRequest {
                id: "auto".into(),
                delta: -1,
            }),
        )
        .unwrap_err();
    assert_eq!(made.code(), tonic::Code::FailedPrecondition, "{made:?}");
    assert!(made.message().contains("existing nodes"), "{made:?}");
    assert_eq!(target(&mut c), 2);

    // NodeGroupForNode by providerID, exactly as knit sets it.
    let group_of = |c: &mut CloudProviderClient<Channel>, id: &str| {
        rt.block_on(c.node_group_for_node(pb::NodeGroupForNodeRequest {
            node: Some(node(id)),
        }))
        .unwrap()
        .into_inner()
        .node_group
        .unwrap()
        .id
    };
    assert_eq!(group_of(&mut c, &ids[0]), "auto");
    assert_eq!(group_of(&mut c, &ids[1]), "auto");
    assert_eq!(group_of(&mut c, "local.i-404"), "");
    // The regular pool's node is of no group.
    let fixed_instance = ts
        .server()
        .control
        .store()
        .instances(Some("fixed"))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let fixed_id = loop {
        let instances = ts
            .server()
            .control
            .store()
            .instances(Some("fixed"))
            .unwrap();
        if let Some(id) = instances.iter().find_map(|i| i.provider_id.clone()) {
            break knit_api::agent::node_id(&region, &id);
        }
        assert!(
            Instant::now() < deadline,
            "fixed pool's instance: {fixed_instance:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(group_of(&mut c, &fixed_id), "");

    // A node of another pool: refused, nothing changed.
    let wrong = rt
        .block_on(c.node_group_delete_nodes(pb::NodeGroupDeleteNodesRequest {
            id: "auto".into(),
            nodes: vec![node(&ids[0]), node(&fixed_id)],
        }))
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::FailedPrecondition, "{wrong:?}");
    assert!(wrong.message().contains("fixed"), "{wrong:?}");
    assert_eq!(target(&mut c), 2);
    assert_eq!(nodes(&mut c).len(), 2);
    assert!(cloud.deleted.lock().unwrap().is_empty());

    // 2 → 1: exactly the named node drained and released.
    rt.block_on(c.node_group_delete_nodes(pb::NodeGroupDeleteNodesRequest {
        id: "auto".into(),
        nodes: vec![node(&ids[0])],
    }))
    .unwrap();
    assert_eq!(target(&mut c), 1);
    let left = wait_for(&mut c, "the named node gone", &|n| n.len() == 1);
    assert_eq!(left[0].id, ids[1]);
    let deleted = cloud.deleted.lock().unwrap().clone();
    let gone = ids[0].rsplit('.').next().unwrap().to_string();
    assert_eq!(deleted, vec![gone]);

    // Below min: refused.
    let below = rt
        .block_on(
            c.node_group_decrease_target_size(pb::NodeGroupDecreaseTargetSizeRequest {
                id: "auto".into(),
                delta: -2,
            }),
        )
        .unwrap_err();
    assert_eq!(below.code(), tonic::Code::FailedPrecondition, "{below:?}");
    assert_eq!(target(&mut c), 1);

    // The rest of the contract.
    let label = rt
        .block_on(c.gpu_label(pb::GpuLabelRequest {}))
        .unwrap()
        .into_inner()
        .label;
    assert_eq!(label, "aliyun.accelerator/nvidia_name");
    let gpus = rt
        .block_on(c.get_available_gpu_types(pb::GetAvailableGpuTypesRequest {}))
        .unwrap()
        .into_inner()
        .gpu_types;
    assert!(
        gpus.contains_key("NVIDIA-A10") && gpus.contains_key("NVIDIA-T4"),
        "{gpus:?}"
    );
    let defaults = pb::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.5,
        scale_down_gpu_utilization_threshold: 0.5,
        max_node_provision_duration: Some(prost_types::Duration {
            seconds: 900,
            nanos: 0,
        }),
        ..Default::default()
    };
    let options = rt
        .block_on(
            c.node_group_get_options(pb::NodeGroupAutoscalingOptionsRequest {
                id: "auto".into(),
                defaults: Some(defaults),
            }),
        )
        .unwrap()
        .into_inner()
        .node_group_autoscaling_options;
    // The pool's own options over the autoscaler's defaults.
    let want = pb::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.6,
        scale_down_unneeded_duration: Some(prost_types::Duration {
            seconds: 300,
            nanos: 0,
        }),
        ..defaults
    };
    assert_eq!(options, Some(want));
    rt.block_on(c.refresh(pb::RefreshRequest {})).unwrap();
    rt.block_on(c.cleanup(pb::CleanupRequest {})).unwrap();
    let price = rt
        .block_on(c.pricing_node_price(pb::PricingNodePriceRequest {
            node: Some(node(&ids[1])),
            ..Default::default()
        }))
        .unwrap_err();
    assert_eq!(price.code(), tonic::Code::Unimplemented);

    // `knit scale` outside [min, max] is refused with the bounds.
    let e = ts
        .client()
        .call(
            "POST",
            "/api/v1/pools/auto/scale",
            Some(r#"{"replicas": 5}"#),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("[0, 2]"), "{e}");
    drop(c);
    drop(rt);
}

const MULTI: &str = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: multi\nspec:\n  replicas: 1\n  instanceTypes: [ecs.g7.large, ecs.c7.xlarge, ecs.r7.large]\n";

/// The pool's types in order: the first has no stock, so the instance is
/// made with the second, an event says which and why, and the instance's
/// record (its Node's instance-type label) says the type it got.
#[test]
fn a_type_without_stock_falls_back_to_the_next_in_order() {
    let cloud = Arc::new(MakingCloud::default());
    cloud
        .no_stock_types
        .lock()
        .unwrap()
        .insert("ecs.g7.large".to_string());
    let mut ts = TestServer::new();
    ts.start(Some(cloud.clone()));
    ts.write_agent_checksum();
    ts.client()
        .call("POST", "/api/v1/pools", Some(MULTI))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let instance = loop {
        let instances = ts
            .server()
            .control
            .store()
            .instances(Some("multi"))
            .unwrap();
        if let Some(i) = instances.iter().find(|i| i.provider_id.is_some()) {
            break i.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{instances:?} {}",
            ts.client().get("/api/v1/events?limit=50").unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(instance.instance_type, "ecs.c7.xlarge");
    assert_eq!(
        cloud.made.lock().unwrap().clone(),
        vec![(instance.name.clone(), "ecs.c7.xlarge".to_string())]
    );
    let events = ts.client().get("/api/v1/events?limit=200").unwrap();
    let fallback: Vec<String> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "InstanceTypeFallback")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(fallback.len(), 1, "{events}");
    assert!(
        fallback[0].starts_with("ecs.g7.large has no capacity")
            && fallback[0].contains("NoStock")
            && fallback[0].ends_with("trying ecs.c7.xlarge"),
        "{fallback:?}"
    );
}
