//! Bounded provider calls and `POST /api/v1/exec` (`knit exec`).
//! `BoundedProvider` over a provider whose calls never answer: each call
//! ends in a ProviderTimeout naming the operation, the instance and the
//! limit; an exec's output over the cap is cut. The exec route on a real
//! server (loopback, TLS, SQLite) over the fake cloud: admin only, the
//! argument vector arrives as sent, the exit code and output come back, an
//! event records who ran what where and the exit code, never the output.

mod support;

use async_trait::async_trait;
use knit_api::{NodeConfig, PhaseEvent, PhaseName, PhaseOutcome};
use knit_client::{ClientError, ExecRequest, EXEC_MAX_TIMEOUT_SECONDS};
use knit_server::provider::{
    BoundedProvider, CallLimits, InstanceTemplate, Provider, ProviderInstance, ProviderSnapshot,
    EXEC_CUT_MARKER,
};
use knit_server::ServerError;
use std::sync::Arc;
use std::time::Duration;
use support::{instance, FakeCloud, TestServer, EXEC_FAILURE};

type Result<T> = std::result::Result<T, ServerError>;

/// A provider whose every call hangs forever, except `exec` when
/// `exec_output` is set: then it answers at once with that many bytes on
/// stdout and stderr.
struct Hanging {
    exec_output: Option<usize>,
}

async fn never<T>() -> Result<T> {
    std::future::pending().await
}

#[async_trait]
impl Provider for Hanging {
    fn name(&self) -> &str {
        "hanging"
    }
    async fn create(&self, _t: &InstanceTemplate) -> Result<ProviderInstance> {
        never().await
    }
    async fn get(&self, _id: &str) -> Result<Option<ProviderInstance>> {
        never().await
    }
    async fn list(&self) -> Result<Vec<ProviderInstance>> {
        never().await
    }
    async fn start(&self, _id: &str) -> Result<()> {
        never().await
    }
    async fn stop(&self, _id: &str) -> Result<()> {
        never().await
    }
    async fn reimage(&self, _id: &str, _image: &str, _user_data: &str) -> Result<()> {
        never().await
    }
    async fn check_image(&self, _image: &str) -> Result<()> {
        never().await
    }
    async fn rename(&self, _id: &str, _name: &str) -> Result<()> {
        never().await
    }
    async fn set_password(&self, _id: &str, _password: &str) -> Result<()> {
        never().await
    }
    async fn delete(&self, _id: &str) -> Result<()> {
        never().await
    }
    async fn read_file(&self, _id: &str, _path: &str) -> Result<Vec<u8>> {
        never().await
    }
    async fn snapshot_create(&self, _id: &str, _i: usize, _n: &str) -> Result<ProviderSnapshot> {
        never().await
    }
    async fn snapshot_delete(&self, _id: &str) -> Result<()> {
        never().await
    }
    async fn exec(&self, _id: &str, _argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
        match self.exec_output {
            Some(n) => Ok((3, vec![b'o'; n], vec![b'e'; n])),
            None => never().await,
        }
    }
}

fn bounded(exec_output: Option<usize>) -> BoundedProvider {
    let short = Duration::from_millis(50);
    BoundedProvider::new(
        Arc::new(Hanging { exec_output }),
        CallLimits {
            call: short,
            create: short,
            read_file: short,
            exec: short,
            exec_output_max: 1000,
        },
    )
}

/// The operation and instance of a ProviderTimeout; anything else fails.
fn timeout_of(e: ServerError) -> (String, String) {
    assert_eq!(e.code(), "ProviderTimeout", "{e}");
    assert_eq!(e.http_status(), 504);
    assert!(e.to_string().contains("did not finish within 1 s"), "{e}");
    assert!(knit_server::provider::is_limit_error(&e));
    match e {
        ServerError::ProviderTimeout {
            operation,
            instance,
            ..
        } => (operation, instance),
        other => panic!("not a timeout: {other}"),
    }
}

#[tokio::test]
async fn a_provider_call_that_never_answers_ends_in_a_timeout_naming_it() {
    let p = bounded(None);
    let pair = |op: &str, what: &str| (op.to_string(), what.to_string());
    assert_eq!(
        timeout_of(p.get("i-1").await.unwrap_err()),
        pair("get", "i-1")
    );
    assert_eq!(
        timeout_of(p.list().await.unwrap_err()),
        pair("list", "(all)")
    );
    assert_eq!(
        timeout_of(p.stop("i-1").await.unwrap_err()),
        pair("stop", "i-1")
    );
    let e = p.reimage("i-1", "host", "").await.unwrap_err();
    assert_eq!(timeout_of(e), pair("reimage", "i-1"));
    let e = p.find_by_name("workers-a").await.unwrap_err();
    assert_eq!(timeout_of(e), pair("find_by_name", "workers-a"));
    let e = p.exec("i-1", &["true".to_string()]).await.unwrap_err();
    assert_eq!(timeout_of(e), pair("exec", "i-1"));
}

#[tokio::test]
async fn exec_output_over_the_cap_is_cut_and_marked() {
    let p = bounded(Some(5000));
    let (code, stdout, stderr) = p.exec("i-1", &["yes".to_string()]).await.unwrap();
    assert_eq!(code, 3);
    let mut expected = vec![b'o'; 1000];
    expected.extend_from_slice(EXEC_CUT_MARKER.as_bytes());
    assert_eq!(stdout, expected);
    assert_eq!(stderr.len(), 1000 + EXEC_CUT_MARKER.len());
    // A caller's larger cap never goes over the provider's.
    let out = p
        .exec_limited("i-1", &["yes".to_string()], Duration::from_secs(5), 1 << 20)
        .await
        .unwrap();
    assert_eq!(
        (out.stdout.len(), out.stdout_cut, out.stderr_cut),
        (1000, true, true)
    );
    // Within the cap: untouched.
    let (_, stdout, _) = bounded(Some(10)).exec("i-1", &[]).await.unwrap();
    assert_eq!(stdout, vec![b'o'; 10]);
}

const POOL: &str = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  replicas: 1\n";

fn status_of(e: ClientError) -> (u16, String, Vec<String>) {
    match e {
        ClientError::Api {
            status,
            code,
            errors,
            ..
        } => (status, code, errors.into_iter().map(|e| e.field).collect()),
        other => panic!("expected a remote error, got {other}"),
    }
}

#[test]
fn exec_runs_through_the_provider_for_the_admin_only_and_is_audited() {
    let mut srv = TestServer::new();
    let cloud = Arc::new(FakeCloud::failing_exec());
    srv.start(Some(cloud.clone()));
    cloud.add(instance("i-000a", "workers-aaaaa", "10.213.0.10"));
    srv.client()
        .call("POST", "/api/v1/pools", Some(POOL))
        .unwrap();
    let cp = &srv.server().control;
    cp.store()
        .add_create_intents(
            "workers",
            &[("workers-aaaaa".into(), "ecs.g7.large".into())],
        )
        .unwrap();
    cp.store()
        .set_instance_created("workers-aaaaa", "i-000a", Some("10.213.0.10"))
        .unwrap();
    let join = cp.issue_join_token("workers-aaaaa", "workers").unwrap();
    // The node's own credential, and a node record from its first report.
    let (status, yaml) = srv
        .client()
        .with_token(&join)
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 200, "{yaml}");
    let config = NodeConfig::from_yaml(&yaml).unwrap();
    // The default node name: `<region>.<instance id>`.
    let node_name = "local.i-000a".to_string();
    let reporter = srv
        .client()
        .with_token(&config.cluster.report_token.unwrap());
    let report = serde_json::to_string(&PhaseEvent {
        node: node_name.clone(),
        instance_id: "i-000a".into(),
        phase: PhaseName::TimeSync,
        outcome: PhaseOutcome::Started,
        reason: None,
        error_code: None,
        at_ms: 1,
        duration_ms: None,
    })
    .unwrap();
    let (status, text) = reporter
        .raw("POST", "/report/v1/events", Some(&report))
        .unwrap();
    assert_eq!(status, 204, "{text}");

    let argv: Vec<String> = ["sh", "-c", "echo 'a b' \"$HOME\""]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let request = ExecRequest {
        kind: "node".into(),
        name: node_name.clone(),
        argv: argv.clone(),
        timeout_seconds: None,
    };
    // A node's report token is not the admin's: refused, nothing run.
    let e = reporter.exec(&request).unwrap_err();
    assert_eq!(status_of(e).0, 401);
    assert!(cloud.calls().iter().all(|c| !c.starts_with("exec")));

    // The admin: run as sent (one argument each), exit code and output back.
    let answer = srv.client().exec(&request).unwrap();
    assert_eq!(answer.exit_code, 1);
    assert_eq!(
        (answer.instance.as_str(), answer.provider_id.as_str()),
        ("workers-aaaaa", "i-000a")
    );
    let (stdout, stderr) = knit_client::exec_output(&answer).unwrap();
    assert_eq!(
        (stdout, stderr),
        (Vec::new(), EXEC_FAILURE.as_bytes().to_vec())
    );
    let execs: Vec<String> = cloud
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("exec"))
        .collect();
    assert_eq!(execs, vec![format!("exec i-000a {}", argv.join(" "))]);
    // By instance name too.
    let by_instance = ExecRequest {
        kind: "instance".into(),
        name: "workers-aaaaa".into(),
        ..request.clone()
    };
    assert_eq!(srv.client().exec(&by_instance).unwrap().exit_code, 1);

    // Audited: who, what, where, the exit code; never the output.
    let events = srv.client().get("/api/v1/events").unwrap();
    let ran: Vec<&serde_json::Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "Exec")
        .collect();
    assert!(!ran.is_empty(), "{events}");
    for e in &ran {
        let message = e["message"].as_str().unwrap();
        assert!(message.starts_with("admin ran "), "{message}");
        assert!(message.contains("workers-aaaaa (i-000a)"), "{message}");
        assert!(message.contains("exit code 1"), "{message}");
        assert!(message.contains("echo 'a b'"), "{message}");
        assert!(!message.contains(EXEC_FAILURE), "{message}");
    }

    // Bad requests name the field; nothing more is run.
    let before = cloud.calls().len();
    let bad = |r: ExecRequest| status_of(srv.client().exec(&r).unwrap_err());
    let (status, _, fields) = bad(ExecRequest {
        timeout_seconds: Some(EXEC_MAX_TIMEOUT_SECONDS + 1),
        ..request.clone()
    });
    assert_eq!((status, fields), (422, vec!["timeoutSeconds".to_string()]));
    let (status, _, fields) = bad(ExecRequest {
        argv: Vec::new(),
        ..request.clone()
    });
    assert_eq!((status, fields), (422, vec!["argv".to_string()]));
    let (status, _, fields) = bad(ExecRequest {
        kind: "pool".into(),
        ..request.clone()
    });
    assert_eq!((status, fields), (422, vec!["kind".to_string()]));
    let (status, code, _) = bad(ExecRequest {
        name: "nobody".into(),
        ..request.clone()
    });
    assert_eq!((status, code.as_str()), (404, "NotFound"));
    assert_eq!(cloud.calls().len(), before);
}
