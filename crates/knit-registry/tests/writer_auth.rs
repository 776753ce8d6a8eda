//! The loopback writer asks for its credential (issue 30, item 6): a real
//! docker-registry pair on loopback (pulls on the address asked for, the
//! writer on another loopback port). A push without the credential, or
//! with a wrong one, is 401 and stores nothing; with it the push lands and
//! pulls (no credential) serve it. The credential file is 0600.

use knit_registry::{Registry, WRITER_TOKEN_FILE, WRITER_USER};
use std::os::unix::fs::PermissionsExt;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `method url` with no body: the status (errors included).
fn call(method: &str, url: &str) -> u16 {
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(30))
        .build();
    // Schema 2 accepted: without it the registry converts to schema 1 (400).
    let request = agent
        .request(method, url)
        .set("Accept", knit_registry::MANIFEST_TYPE);
    match request.send_bytes(&[]) {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

#[test]
fn a_push_without_the_writer_credential_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let reg_dir = dir.path().join("registry");
    let reg = Registry::start(&reg_dir, &format!("127.0.0.1:{}", free_port())).unwrap();
    assert_eq!(reg.pids().len(), 2, "a pull listener and the writer");
    let token_file = reg_dir.join(WRITER_TOKEN_FILE);
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", token_file.display());
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim();
    assert!(token.len() >= 32);

    let image = knit_registry::build_image(&dir.path().join("img"), "knit/app:1", 1, 4096).unwrap();
    let bare = reg.push_url_without_credential();
    assert!(!bare.contains('@'));
    // No credential: 401 at the first write, nothing stored.
    let e = knit_registry::push(&bare, "knit/app:1", &image).unwrap_err();
    assert!(e.to_string().contains("401"), "{e}");
    assert_eq!(
        call("POST", &format!("{bare}/v2/knit/app/blobs/uploads/")),
        401
    );
    // A wrong one: the same.
    let wrong = knit_registry::credential_url(&bare, "not-the-token");
    let e = knit_registry::push(&wrong, "knit/app:1", &image).unwrap_err();
    assert!(e.to_string().contains("401"), "{e}");
    let pull = reg.url();
    assert!(knit_registry::catalog(&pull).unwrap().is_empty());
    assert_eq!(call("GET", &format!("{pull}/v2/knit/app/manifests/1")), 404);

    // With it (`push_url` carries it): the push lands.
    let push = reg.push_url();
    assert!(
        push.starts_with(&format!("http://{WRITER_USER}:")),
        "{push}"
    );
    knit_registry::push(&push, "knit/app:1", &image).unwrap();
    // Pulls ask for nothing, on the pull listener (loopback here too),
    // and cannot write there.
    assert_eq!(
        knit_registry::manifest_digest(&pull, "knit/app:1").unwrap(),
        image.manifest_digest
    );
    assert_eq!(call("GET", &format!("{pull}/v2/knit/app/manifests/1")), 200);
    assert_eq!(
        call("POST", &format!("{pull}/v2/knit/app/blobs/uploads/")),
        405
    );
    // The credential never reaches the log.
    assert!(!reg.log_text().contains(token), "the log holds the token");
}
