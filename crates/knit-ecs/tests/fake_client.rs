//! The client against the fake ECS: signatures really checked, retries only
//! where safe, ClientToken de-duplication, errors with ECS's code, message
//! and request id, and no secret in any Debug or error text.

use knit_ecs::api::{DataDisk, DescribeInstances, RunInstances};
use knit_ecs::fake::{FakeEcs, Fault};
use knit_ecs::{Client, ClientConfig, Credentials, EcsError, Params};
use std::collections::BTreeMap;
use std::time::Duration;

fn client_for(fake: &FakeEcs, creds: Credentials) -> Client {
    let mut cfg = ClientConfig::new(&fake.region(), Some(&fake.url())).unwrap();
    cfg.retry.first_backoff = Duration::from_millis(1);
    cfg.retry.max_backoff = Duration::from_millis(5);
    cfg.timeout = Duration::from_secs(10);
    Client::new(cfg, creds)
}

fn run_request(fake: &FakeEcs, token: &str) -> RunInstances {
    let cfg = fake.config();
    RunInstances {
        image_id: cfg.images[0].clone(),
        instance_type: "ecs.g7.large".into(),
        v_switch_id: Some("vsw-fake0001".into()),
        security_group_ids: vec!["sg-fake0001".into()],
        instance_name: "workers-abcde".into(),
        host_name: Some("workers-abcde".into()),
        user_data: "#!/bin/sh\necho hello\n".into(),
        system_disk_gib: Some(40),
        data_disks: vec![DataDisk {
            size_gib: Some(20),
            delete_with_instance: true,
            ..Default::default()
        }],
        tags: [("knit.dev/pool".to_string(), "workers".to_string())]
            .into_iter()
            .collect(),
        client_token: token.into(),
        ..Default::default()
    }
}

#[test]
fn signed_calls_pass_and_wrong_signatures_are_refused() {
    let fake = FakeEcs::start();
    let good = client_for(&fake, fake.credentials());
    let me = good.get_caller_identity().unwrap();
    assert_eq!(me.account_id, fake.config().account_id);

    // Right key id, wrong secret: the fake recomputes and refuses.
    let id = fake.credentials().access_key_id().to_string();
    let bad = client_for(
        &fake,
        Credentials::new(&id, "not-the-secret", None).unwrap(),
    );
    match bad.describe_instances(&DescribeInstances::default()) {
        Err(EcsError::Api {
            code,
            status,
            request_id,
            ..
        }) => {
            assert_eq!(code, "SignatureDoesNotMatch");
            assert_eq!(status, 400);
            assert!(!request_id.is_empty());
        }
        other => panic!("expected SignatureDoesNotMatch, got {other:?}"),
    }
    // An unknown key id.
    let stranger = client_for(&fake, Credentials::new("LTAIother", "x", None).unwrap());
    let e = stranger.get_caller_identity().unwrap_err();
    assert_eq!(e.code(), "InvalidAccessKeyId.NotFound");
    // A refused signature is not repeated.
    assert_eq!(fake.calls("DescribeInstances"), 0);
}

/// A request signed correctly, then changed (a parameter added to the URL),
/// is refused: the signature covers the query string.
#[test]
fn tampered_query_is_refused_and_nonces_are_single_use() {
    use knit_ecs::sign;
    let fake = FakeEcs::start();
    let creds = fake.config();
    let host = fake.url().trim_start_matches("http://").to_string();
    let query: BTreeMap<String, String> = [("RegionId".to_string(), fake.region())].into();
    let hashed = sign::sha256_hex(b"");
    let headers: BTreeMap<String, String> = [
        ("host", host.as_str()),
        ("x-acs-action", "DescribeInstances"),
        ("x-acs-version", "2014-05-26"),
        ("x-acs-content-sha256", hashed.as_str()),
        ("x-acs-signature-nonce", "nonce-0001"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("x-acs-date".to_string(), knit_ecs::client::acs_date())])
    .collect();
    let auth = sign::authorization(
        &sign::SignInput {
            method: "POST",
            path: "/",
            query: &query,
            headers: &headers,
            hashed_payload: &hashed,
        },
        &creds.access_key_id,
        creds.access_key_secret.as_bytes(),
    );
    let send = |url: String| {
        let mut r = ureq::post(&url);
        for (k, v) in &headers {
            r = r.set(k, v);
        }
        match r.set("Authorization", &auth).send_bytes(&[]) {
            Ok(resp) => (resp.status(), resp.into_string().unwrap()),
            Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap()),
            Err(e) => panic!("{e}"),
        }
    };
    let base = format!("{}/?{}", fake.url(), sign::canonical_query(&query));
    let (status, body) = send(format!("{base}&InstanceName=other"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("SignatureDoesNotMatch"), "{body}");
    // The untouched request passes once; the same nonce again is refused.
    let (status, body) = send(base.clone());
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(base);
    assert_eq!(status, 400);
    assert!(body.contains("SignatureNonceUsed"), "{body}");
}

#[test]
fn throttling_is_retried_and_unsafe_repeats_are_not() {
    let fake = FakeEcs::start();
    let c = client_for(&fake, fake.credentials());
    fake.inject("DescribeInstances", Fault::Throttling, 3);
    assert!(c
        .describe_instances(&DescribeInstances::default())
        .unwrap()
        .is_empty());
    assert_eq!(fake.calls("DescribeInstances"), 4);

    // Too much throttling: the last error comes back with ECS's code.
    fake.inject("DescribeInstances", Fault::Throttling, 100);
    let e = c
        .describe_instances(&DescribeInstances::default())
        .unwrap_err();
    assert_eq!(e.code(), "Throttling.User");
    assert!(e.to_string().contains("RequestId"), "{e}");

    // A server error on a call that is neither a read nor carries a
    // ClientToken is not sent again: it may have been carried out.
    let id = c.run_instances(&run_request(&fake, "tok-start")).unwrap();
    fake.inject("StartInstance", Fault::ServerError, 1);
    let e = c.start_instance(&id).unwrap_err();
    assert_eq!(e.code(), "InternalError");
    assert_eq!(fake.calls("StartInstance"), 1);

    // A gateway's HTML page (503): a server error, repeated for a read,
    // and once the retries are spent the error still names the request
    // (from the x-acs-request-id header, the body having none).
    fake.inject("DescribeDisks", Fault::GatewayPage, 2);
    assert!(!c.describe_disks(&id, "all").unwrap().is_empty());
    assert_eq!(fake.calls("DescribeDisks"), 3);
    fake.inject("DescribeDisks", Fault::GatewayPage, 100);
    match c.describe_disks(&id, "all").unwrap_err() {
        EcsError::Api {
            code,
            status,
            request_id,
            ..
        } => {
            assert_eq!((code.as_str(), status), ("ServiceUnavailable", 503));
            assert_eq!(request_id.len(), 36, "{request_id:?}");
        }
        other => panic!("expected a server error, got {other:?}"),
    }
}

#[test]
fn client_token_makes_run_instances_idempotent() {
    let fake = FakeEcs::start();
    let c = client_for(&fake, fake.credentials());
    // The answer is lost after the instance was made; the retry carries the
    // same ClientToken and gets the same instance back.
    fake.inject("RunInstances", Fault::LoseAnswer, 1);
    let id = c.run_instances(&run_request(&fake, "tok-1")).unwrap();
    assert_eq!(fake.calls("RunInstances"), 2);
    assert_eq!(fake.instances().len(), 1);
    // A later call with the same token: same instance, nothing new.
    assert_eq!(c.run_instances(&run_request(&fake, "tok-1")).unwrap(), id);
    assert_eq!(fake.instances().len(), 1);
    // Same token, other parameters.
    let mut other = run_request(&fake, "tok-1");
    other.instance_type = "ecs.g7.xlarge".into();
    let e = c.run_instances(&other).unwrap_err();
    assert_eq!(e.code(), "IdempotentParameterMismatch");
    let i = fake.instance(&id).unwrap();
    assert_eq!(i.user_data, "#!/bin/sh\necho hello\n");
    assert_eq!(i.tags["knit.dev/pool"], "workers");
}

#[test]
fn states_quota_and_status_errors() {
    let fake = FakeEcs::start();
    let c = client_for(&fake, fake.credentials());
    let id = c.run_instances(&run_request(&fake, "tok-2")).unwrap();
    let mut seen = Vec::new();
    for _ in 0..10 {
        let s = c.describe_instance(&id).unwrap().unwrap().status;
        if seen.last() != Some(&s) {
            seen.push(s.clone());
        }
        if s == "Running" {
            break;
        }
    }
    assert_eq!(seen, ["Pending", "Starting", "Running"]);
    let e = c.start_instance(&id).unwrap_err();
    assert_eq!(e.code(), "IncorrectInstanceStatus");
    let EcsError::Api {
        status, message, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(*status, 403);
    assert!(!message.is_empty());

    fake.set_instance_quota(1);
    let e = c.run_instances(&run_request(&fake, "tok-3")).unwrap_err();
    assert_eq!(e.code(), "QuotaExceed.ElasticQuota");
    assert!(c.describe_instance("i-nothere").unwrap().is_none());
    let e = c.call("NoSuchAction", Params::new()).unwrap_err();
    assert_eq!(e.code(), "InvalidAction.NotFound");
}

#[test]
fn no_secret_in_debug_or_errors() {
    let fake = FakeEcs::start();
    let secret = fake.config().access_key_secret;
    let c = client_for(&fake, fake.credentials());
    let shown = format!("{c:?}");
    assert!(!shown.contains(&secret), "{shown}");
    let m = knit_ecs::api::ModifyInstanceAttribute {
        instance_id: "i-x".into(),
        password: Some("Secr3t!pass".into()),
        ..Default::default()
    };
    assert!(!format!("{m:?}").contains("Secr3t!pass"));
    let e = c.modify_instance_attribute(&m).unwrap_err();
    assert_eq!(e.code(), "InvalidInstanceId.NotFound");
    assert!(!e.to_string().contains("Secr3t!pass"));
    assert!(!format!("{e:?}").contains(&secret));
}

/// The fake's Cloud Assistant runs a command the way it models an
/// instance: its own network (loopback only), PID namespace and files
/// (/tmp kept between its commands, not shared with another instance), and
/// no way to write the host's files.
#[test]
fn cloud_assistant_commands_run_confined() {
    let fake = FakeEcs::start();
    let c = client_for(&fake, fake.credentials());
    let running = |token: &str| {
        let id = c.run_instances(&run_request(&fake, token)).unwrap();
        for _ in 0..20 {
            if c.describe_instance(&id).unwrap().unwrap().status == "Running" {
                return id;
            }
        }
        panic!("{id} never ran");
    };
    let (a, b) = (running("confined-a"), running("confined-b"));
    let run = |id: &str, script: &str| -> (i64, String) {
        let token = format!("cmd-{}-{}", id, fake.calls("RunCommand"));
        let invoke = c.run_command(id, script, 30, &token).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let r = c.describe_invocation_result(&invoke, id).unwrap().unwrap();
            if r.invoke_record_status == "Finished" {
                use base64::Engine;
                let out = base64::engine::general_purpose::STANDARD
                    .decode(r.output)
                    .unwrap();
                return (r.exit_code, String::from_utf8_lossy(&out).into_owned());
            }
            assert!(std::time::Instant::now() < deadline, "{script} hangs");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let mut tag = [0u8; 6];
    getrandom::getrandom(&mut tag).unwrap();
    let escape = format!("/etc/knit-fake-escape-{}", hex::encode(tag));
    let (code, out) = run(
        &a,
        &format!(
            "echo kept > /tmp/mark\n\
             tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '\n\
             echo \"pid $$\"\n\
             touch {escape} 2>/dev/null && echo escaped\n\
             kill -0 {me} 2>/dev/null && echo sees-the-host\n\
             exit 0\n",
            me = std::process::id()
        ),
    );
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"lo"), "only loopback: {out}");
    assert!(lines[1].starts_with("pid "), "{out}");
    let pid: u32 = lines[1][4..].parse().unwrap();
    assert!(pid < 100, "its own PID namespace: {out}");
    assert!(!out.contains("sees-the-host"), "{out}");
    assert!(!out.contains("escaped"), "{out}");
    assert!(!std::path::Path::new(&escape).exists());
    assert_eq!(run(&a, "cat /tmp/mark"), (0, "kept\n".to_string()));
    let (code, _) = run(&b, "cat /tmp/mark 2>/dev/null");
    assert_ne!(code, 0, "another instance has its own /tmp");
    assert_eq!(run(&b, "hostname"), (0, "workers-abcde\n".to_string()));
}

/// ECS's parameters go in the signed query string with an empty body, as
/// the official SDKs send them: a correctly signed request carrying them
/// in a form body instead is refused by the fake, so a client that drifts
/// to another form fails here rather than at the real gateway.
#[test]
fn parameters_in_a_body_are_refused() {
    use knit_ecs::sign;
    let fake = FakeEcs::start();
    let creds = fake.config();
    let host = fake.url().trim_start_matches("http://").to_string();
    let body = format!("RegionId={}", fake.region());
    let hashed = sign::sha256_hex(body.as_bytes());
    let headers: BTreeMap<String, String> = [
        ("host", host.as_str()),
        ("content-type", "application/x-www-form-urlencoded"),
        ("x-acs-action", "DescribeInstances"),
        ("x-acs-version", "2014-05-26"),
        ("x-acs-content-sha256", hashed.as_str()),
        ("x-acs-signature-nonce", "nonce-body-0001"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("x-acs-date".to_string(), knit_ecs::client::acs_date())])
    .collect();
    let no_query = BTreeMap::new();
    let auth = sign::authorization(
        &sign::SignInput {
            method: "POST",
            path: "/",
            query: &no_query,
            headers: &headers,
            hashed_payload: &hashed,
        },
        &creds.access_key_id,
        creds.access_key_secret.as_bytes(),
    );
    let mut r = ureq::post(&format!("{}/", fake.url()));
    for (k, v) in &headers {
        r = r.set(k, v);
    }
    let (status, text) = match r.set("Authorization", &auth).send_bytes(body.as_bytes()) {
        Ok(resp) => (resp.status(), resp.into_string().unwrap()),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap()),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("query string"), "{text}");
    assert_eq!(fake.calls("DescribeInstances"), 0);
}
