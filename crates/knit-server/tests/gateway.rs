//! The address instances are told comes from the provider's gateway, never
//! from a built-in one. The "gateway" here is 127.0.0.2, a loopback address
//! that is not the server's first one, standing for a non-default subnet's
//! gateway (e.g. 10.219.1.1 with KNIT_LOCAL_SUBNET=10.219.1.0/24).

mod support;

use async_trait::async_trait;
use knit_client::{Client, ClientConfig};
use knit_server::provider::{InstanceTemplate, Provider, ProviderInstance, ProviderSnapshot};
use knit_server::{ServerError, Settings};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::TestServer;

type Result<T> = std::result::Result<T, ServerError>;

const GATEWAY: &str = "127.0.0.2";

/// A provider on a network whose gateway is [`GATEWAY`]; it keeps the user
/// data of every instance it is asked to make.
#[derive(Default)]
struct OtherSubnet {
    user_data: Mutex<Vec<String>>,
}

fn no(what: &str) -> ServerError {
    ServerError::from(knit_server::provider::ProviderError::failed(
        "other-subnet",
        format!("{what} is not part of this test"),
    ))
}

#[async_trait]
impl Provider for OtherSubnet {
    fn name(&self) -> &str {
        "other-subnet"
    }
    fn gateway(&self) -> Option<IpAddr> {
        GATEWAY.parse().ok()
    }
    async fn create(&self, t: &InstanceTemplate) -> Result<ProviderInstance> {
        self.user_data.lock().unwrap().push(t.user_data.clone());
        Err(no("creating instances"))
    }
    async fn get(&self, _id: &str) -> Result<Option<ProviderInstance>> {
        Ok(None)
    }
    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        Ok(Vec::new())
    }
    async fn start(&self, _id: &str) -> Result<()> {
        Err(no("start"))
    }
    async fn stop(&self, _id: &str) -> Result<()> {
        Err(no("stop"))
    }
    async fn reimage(&self, _id: &str, _image: &str, _user_data: &str) -> Result<()> {
        Err(no("reimage"))
    }
    async fn check_image(&self, _image: &str) -> Result<()> {
        Ok(())
    }
    async fn rename(&self, _id: &str, _name: &str) -> Result<()> {
        Err(no("rename"))
    }
    async fn set_password(&self, _id: &str, _password: &str) -> Result<()> {
        Err(no("set_password"))
    }
    async fn delete(&self, _id: &str) -> Result<()> {
        Ok(())
    }
    async fn read_file(&self, _id: &str, _path: &str) -> Result<Vec<u8>> {
        Err(no("read_file"))
    }
    async fn snapshot_create(&self, _id: &str, _i: usize, _n: &str) -> Result<ProviderSnapshot> {
        Err(no("snapshot_create"))
    }
    async fn snapshot_delete(&self, _id: &str) -> Result<()> {
        Err(no("snapshot_delete"))
    }
}

#[test]
fn the_advertised_host_is_the_providers_gateway_where_the_server_listens() {
    let settings = Settings::new("/nonexistent".into());
    let gw: IpAddr = "10.219.1.1".parse().unwrap();
    let at = |a: &str| -> SocketAddr { a.parse().unwrap() };
    let host =
        |addrs: &[SocketAddr], gateway| knit_server::advertise_host(&settings, addrs, gateway);
    assert_eq!(host(&[at("0.0.0.0:7443")], Some(gw)), "10.219.1.1");
    assert_eq!(
        host(&[at("127.0.0.1:7443"), at("10.219.1.1:7443")], Some(gw)),
        "10.219.1.1"
    );
    // Not listening on the gateway: not advertised there.
    assert_eq!(host(&[at("127.0.0.1:7443")], Some(gw)), "127.0.0.1");
    assert_eq!(host(&[at("0.0.0.0:7443")], None), "127.0.0.1");
    let mut told = Settings::new("/nonexistent".into());
    told.advertise_host = Some("knit.example".into());
    assert_eq!(
        knit_server::advertise_host(&told, &[at("0.0.0.0:7443")], Some(gw)),
        "knit.example"
    );
    // The local cloud's gateway is its subnet's first host.
    assert_eq!(
        knit_server::provider::local::local_gateway("10.219.1.0/24").unwrap(),
        "10.219.1.1".parse::<std::net::Ipv4Addr>().unwrap()
    );
}

#[test]
fn instances_are_told_the_providers_gateway_and_the_certificate_names_it() {
    let mut h = TestServer::new();
    h.settings.also_listen = vec![GATEWAY.parse().unwrap()];
    h.settings.reconcile_interval = Duration::from_millis(200);
    h.settings.max_create_attempts = 1;
    h.write_agent_checksum();
    let cloud = Arc::new(OtherSubnet::default());
    h.start(Some(cloud.clone()));
    let server = h.server();
    let port = server.addr.port();
    assert!(
        server
            .addrs
            .contains(&format!("{GATEWAY}:{port}").parse().unwrap()),
        "{:?}",
        server.addrs
    );
    let expected = format!("https://{GATEWAY}:{port}");
    assert_eq!(server.control.advertise_url(), expected);
    // The serving certificate names the gateway: TLS to it verifies.
    let at_gateway = Client::new(&ClientConfig {
        server: expected.clone(),
        token: server.admin_token().to_string(),
        ca_cert: server.ca_pem().to_string(),
        state_dir: None,
        pid: None,
    })
    .unwrap();
    assert_eq!(at_gateway.raw("GET", "/healthz", None).unwrap().0, 200);
    // The composed user data (the stub) fetches from the gateway.
    at_gateway
        .call(
            "POST",
            "/api/v1/pools",
            Some("apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  replicas: 1\n"),
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let user_data = loop {
        if let Some(u) = cloud.user_data.lock().unwrap().first().cloned() {
            break u;
        }
        assert!(Instant::now() < deadline, "no instance was asked for");
        std::thread::sleep(Duration::from_millis(50));
    };
    // The stub's values are shell assignments at its top.
    assert!(
        user_data.contains(&format!("\nbootstrap_url={expected}/bootstrap/v1/config\n")),
        "{user_data}"
    );
    assert!(user_data.contains(&format!("\nmirror={expected}/mirror\n")));
    assert!(!user_data.contains("10.213.0.1"), "{user_data}");
}
