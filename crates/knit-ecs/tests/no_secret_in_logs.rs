//! Everything the client logs, at every level, while it signs, retries and
//! fails: never the AccessKey secret, a password or user data.

use knit_ecs::api::{ModifyInstanceAttribute, RunInstances};
use knit_ecs::fake::{FakeEcs, Fault};
use knit_ecs::{Client, ClientConfig};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logs_hold_no_secret() {
    let captured = Captured::default();
    let writer = captured.clone();
    // knit server's own filter keeps ureq at warn: ureq prints request
    // headers at debug (x-acs-security-token among them).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(format!(
            "trace,{}",
            knit_ecs::LOG_DIRECTIVE
        )))
        .with_writer(move || writer.clone())
        .init();

    let fake = FakeEcs::start_with(knit_ecs::fake::FakeConfig {
        security_token: Some("sts-token-CAISzQFakeToken".into()),
        ..Default::default()
    });
    let secret = fake.config().access_key_secret;
    let mut cfg = ClientConfig::new(&fake.region(), Some(&fake.url())).unwrap();
    cfg.retry.first_backoff = Duration::from_millis(1);
    let c = Client::new(cfg, fake.credentials());
    c.get_caller_identity().unwrap();
    fake.inject("RunInstances", Fault::Throttling, 2);
    let id = c
        .run_instances(&RunInstances {
            image_id: fake.config().images[0].clone(),
            instance_type: "ecs.g7.large".into(),
            v_switch_id: Some("vsw-fake0001".into()),
            security_group_ids: vec!["sg-fake0001".into()],
            instance_name: "n1".into(),
            user_data: "TOKEN=user-data-bootstrap-token-4711".into(),
            client_token: "t1".into(),
            ..Default::default()
        })
        .unwrap();
    for _ in 0..3 {
        let _ = c.describe_instance(&id);
    }
    let _ = c.modify_instance_attribute(&ModifyInstanceAttribute {
        instance_id: id.clone(),
        password: Some("Pa55word-9931!".into()),
        ..Default::default()
    });
    let _ = c.modify_instance_attribute(&ModifyInstanceAttribute {
        instance_id: "i-nothere".into(),
        password: Some("Pa55word-9931!".into()),
        ..Default::default()
    });
    drop(fake);
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("repeating it"),
        "the retries were logged:\n{text}"
    );
    for secret in [
        secret.as_str(),
        "sts-token-CAISzQFakeToken",
        "Pa55word-9931",
        "bootstrap-token-4711",
    ] {
        assert!(!text.contains(secret), "{secret} in the logs:\n{text}");
    }
    // Base64 of the user data is not there either.
    use base64::Engine;
    let encoded =
        base64::engine::general_purpose::STANDARD.encode("TOKEN=user-data-bootstrap-token-4711");
    assert!(!text.contains(&encoded[..20]));
}
