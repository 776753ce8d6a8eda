//! The web console in a real browser: headless Chromium, driven over
//! WebDriver, against a real `knit server` with the local cloud and the
//! embedded cluster. Sign in; create a pool from YAML; a bad document is
//! refused with the field's message; a bad scale with the API's message;
//! scale to 2 and watch, without reloading, both nodes reach Ready; open a
//! node and find its timeline with every phase it reported; add existing
//! instances of the local cloud (in no pool): the dry-run preflight shows
//! every check with its code, message and fix, as the API answers it, a
//! refused attach changes nothing, an automatic attach is followed on the
//! same page until its node is Ready, and the manual command is given (and
//! a bad token lifetime refused with the API's message); a node whose
//! removal a PodDisruptionBudget blocks shown draining with the budget, as
//! `knit get nodes` shows it, and its page naming the budget; sign out and be
//! refused. Security without a browser's help: no cookie is sent to the
//! sign-in page, a cross-site POST (other or no Origin, wrong or no CSRF
//! token) is refused, and a session expires.
//!
//! Needs root (the local cloud) and Debian's chromium + chromium-driver
//! (scripts/setup.sh); without them it fails saying so. Screenshots of the
//! pools page, a node's timeline and the add-instances page go to
//! target/console-artifacts/.

mod common;

use common::browser::{self, answer, Driver};
use common::Env;
use fantoccini::{Client, Locator};
use serde_json::Value;
use std::time::{Duration, Instant};

const POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: workers}
spec:
  replicas: 0
  systemDisk: {sizeGiB: 20}
  dataDisks: [{sizeGiB: 40, interface: nvme}]
  preUserData: touch /var/.skip-yum
  userData: echo user-data ran > /root/user-data-ran
";

const BAD_POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: broken}
spec:
  replicas: -1
";

const COOKIE: &str = "__Host-knit-console";

/// An instance the user owns, in no pool, that passes the preflight (the
/// pool's default instance type).
const OWNED: &str = "name: old-web
instanceType: ecs.g7.large
";

/// One that does not: swap on, and an instance type the pool does not have.
const SWAPPY: &str = "name: swappy
attributes: {swap: true}
";

struct Console {
    base: String,
    token: String,
    agent: ureq::Agent,
}

impl Console {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn get(&self, path: &str, cookie: Option<&str>) -> browser::Answer {
        let mut r = self.agent.get(&self.url(path));
        if let Some(c) = cookie {
            r = r.set("Cookie", &format!("{COOKIE}={c}"));
        }
        answer(r.call())
    }

    /// A form POST with the given `Origin` (None: none) and cookie.
    fn post(
        &self,
        path: &str,
        origin: Option<&str>,
        cookie: Option<&str>,
        form: &[(&str, &str)],
    ) -> browser::Answer {
        let mut r = self.agent.post(&self.url(path));
        if let Some(o) = origin {
            r = r.set("Origin", o);
        }
        if let Some(c) = cookie {
            r = r.set("Cookie", &format!("{COOKIE}={c}"));
        }
        answer(r.send_form(form))
    }

    /// Signs in without a browser: the session id from `Set-Cookie`.
    fn sign_in(&self) -> String {
        let a = self.post(
            "/ui/sign-in",
            Some(&self.base),
            None,
            &[("token", self.token.as_str())],
        );
        assert_eq!(a.status, 303, "{}", a.body);
        let set = a.set_cookie.expect("a session cookie");
        for guard in [
            "HttpOnly",
            "Secure",
            "SameSite=Strict",
            "Max-Age=",
            "Path=/",
        ] {
            assert!(set.contains(guard), "{set}");
        }
        set.strip_prefix(&format!("{COOKIE}="))
            .and_then(|v| v.split(';').next())
            .expect("the cookie's value")
            .to_string()
    }
}

/// The CSRF token of a page's forms.
fn csrf_of(html: &str) -> String {
    let at = html
        .find(r#"name="csrf" value=""#)
        .expect("a CSRF field on the page");
    let rest = &html[at + r#"name="csrf" value=""#.len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

async fn wait_for_url(client: &Client, part: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let url = client.current_url().await.unwrap().to_string();
        if url.contains(part) {
            return url;
        }
        if Instant::now() > deadline {
            let text = js(client, "return document.body.innerText").await;
            panic!(
                "never reached {part}: at {url}, showing:\n{}",
                text.as_str().unwrap_or("")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn browser_sign_in(client: &Client, console: &Console) {
    client.goto(&console.url("/ui/pools")).await.unwrap();
    // No cookie: the sign-in page.
    wait_for_url(client, "/ui/sign-in", Duration::from_secs(10)).await;
    let field = match client
        .wait()
        .at_most(Duration::from_secs(5))
        .for_element(Locator::Id("token"))
        .await
    {
        Ok(f) => f,
        Err(_) => {
            // A load aborted by a host network change: once more.
            eprintln!("the sign-in page did not load (a host network change?); reloaded once");
            client.refresh().await.unwrap();
            client.find(Locator::Id("token")).await.unwrap()
        }
    };
    field.send_keys(&console.token).await.unwrap();
    client
        .find(Locator::Css("form.sign-in button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let url = wait_for_url(client, "/ui/pools", Duration::from_secs(10)).await;
    assert!(
        !url.contains(&console.token),
        "the token is in a URL: {url}"
    );
}

/// The real `kubectl` with the embedded cluster's admin kubeconfig: its
/// output; a failure fails the test.
fn kubectl(kubeconfig: &std::path::Path, args: &[&str], stdin: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl (Debian's kubernetes-client) must be installed");
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn js(client: &Client, script: &str) -> Value {
    client
        .execute(script, vec![])
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"))
}

async fn submit_yaml(client: &Client, console: &Console, yaml: &str) {
    client.goto(&console.url("/ui/pools/new")).await.unwrap();
    client
        .execute(
            "document.getElementById('yaml').value = arguments[0];",
            vec![Value::String(yaml.to_string())],
        )
        .await
        .unwrap();
    client
        .find(Locator::Css("form.yaml button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn scale_in_browser(client: &Client, replicas: &str) {
    let input = client.find(Locator::Id("replicas-workers")).await.unwrap();
    input.clear().await.unwrap();
    input.send_keys(replicas).await.unwrap();
    client
        .find(Locator::Css(r#"form.scale[data-pool="workers"] button"#))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// The page a click loaded (at `part`), whole and connected to the live
/// feed. The local cloud adds or changes a machine's network link at such
/// moments, and Chromium aborts the loads in flight on a host network
/// change (net::ERR_NETWORK_CHANGED): the page may have come without its
/// script. A user would reload it; so does the test, once, and says so.
/// What follows must then happen on that one page, without a reload.
async fn live_page(client: &Client, part: &str, what: &str) {
    wait_for_url(client, part, Duration::from_secs(20)).await;
    let connected = "return !!(document.body && document.body.dataset.liveState === 'connected')";
    let loaded = Instant::now() + Duration::from_secs(5);
    while js(client, connected).await != Value::Bool(true) {
        if Instant::now() > loaded {
            eprintln!(
                "the page after {what} did not load whole (a host network change); reloaded once"
            );
            client.refresh().await.unwrap();
            wait_for_url(client, part, Duration::from_secs(10)).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    js(client, "window.__sameDocument = true;").await;
}

/// The page was updated live and never reloaded since [`live_page`].
async fn assert_same_document(client: &Client) {
    let same = js(
        client,
        "return window.__sameDocument === true && !!document.body.dataset.refreshed",
    )
    .await;
    assert_eq!(same, Value::Bool(true), "updated without a reload");
}

/// An element of the page a click loaded: waited for, and the page
/// reloaded once when it did not come (a load aborted by a host network
/// change: the local clouds on this machine add and remove links).
async fn find_on_page(client: &Client, locator: Locator<'_>) -> fantoccini::elements::Element {
    if let Ok(e) = client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(locator)
        .await
    {
        return e;
    }
    let text = js(
        client,
        "return document.body ? document.body.innerText : ''",
    )
    .await;
    eprintln!(
        "the page did not show {locator:?} (a host network change?); reloaded once. It showed:\n{}",
        text.as_str().unwrap_or("")
    );
    client.refresh().await.unwrap();
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(locator)
        .await
        .unwrap_or_else(|e| panic!("{locator:?} after a reload: {e}"))
}

async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

/// Submits a form by clicking `css` and waits for the page it answers
/// (the old one's elements would otherwise be found first).
async fn submit(client: &Client, css: &str) {
    js(client, "window.__oldPage = true;").await;
    click(client, css).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let arrived = "return window.__oldPage !== true && document.readyState === 'complete'";
    while js(client, arrived).await != Value::Bool(true) {
        if Instant::now() > deadline {
            let text = js(client, "return document.body.innerText").await;
            panic!("no new page after {css}:\n{}", text.as_str().unwrap_or(""));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each preflight table on the page: instance -> [(status, code, message, fix)].
async fn preflight_on_page(client: &Client) -> Value {
    js(
        client,
        "var out = {}; document.querySelectorAll('#preflight table.preflight').forEach(function (t) { \
           out[t.dataset.instance] = Array.from(t.querySelectorAll('tbody tr')).map(function (r) { \
             var c = r.querySelectorAll('td'); \
             return [r.dataset.status, r.dataset.code, c[3].textContent, c[4].textContent]; }); }); \
         return out;",
    )
    .await
}

/// The same from the API's answer.
fn preflight_of(answer: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for report in answer["preflight"].as_array().expect("a preflight") {
        let rows: Vec<Value> = report["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| serde_json::json!([r["status"], r["code"], r["message"], r["fix"]]))
            .collect();
        out.insert(
            report["instance"].as_str().unwrap().to_string(),
            Value::Array(rows),
        );
    }
    Value::Object(out)
}

#[test]
fn the_console_in_a_real_browser() {
    browser::require_chromium();
    let console_port = common::free_port();
    let mut env = Env::builder()
        .cluster(true)
        .parallelism(2)
        .env("KNIT_CONSOLE_LISTEN", format!("127.0.0.1:{console_port}"))
        .env("KNIT_CONSOLE_SESSION_TTL", "3600")
        .build();
    // Instances of the local cloud in no pool, made first: each adds a
    // network link, and Chromium aborts the loads in flight on a host
    // network change (see `live_page`); the package build leaves it time.
    env.network_up();
    let owned = env.instance(OWNED);
    let swappy = env.instance(SWAPPY);
    let (ok, out, err) = env.knit(&[
        "package",
        "build",
        "--state-dir",
        env.path("server").to_str().unwrap(),
    ]);
    assert!(ok, "package build (containerd and runc needed): {out}{err}");
    env.start_server();
    let ca = std::fs::read_to_string(env.state_dir().join("pki/ca.pem")).unwrap();
    let token = std::fs::read_to_string(env.state_dir().join("admin-token"))
        .unwrap()
        .trim()
        .to_string();
    let api =
        knit_client::Client::new(&knit_client::ClientConfig::load(&env.path("config")).unwrap())
            .unwrap();
    let console = Console {
        base: format!("https://127.0.0.1:{console_port}"),
        token,
        agent: browser::https_agent(&ca),
    };
    let evil = "https://evil.example";

    // ---- security, as a script or another site would send it
    let a = console.get("/ui/pools", None);
    assert_eq!(
        (a.status, a.location.as_deref()),
        (303, Some("/ui/sign-in"))
    );
    let a = console.get("/ui/nodes/anything", Some("not-a-session"));
    assert_eq!(a.location.as_deref(), Some("/ui/sign-in"));
    let a = console.post(
        "/ui/sign-in",
        Some(evil),
        None,
        &[("token", console.token.as_str())],
    );
    assert_eq!(a.status, 403, "a cross-site sign-in: {}", a.body);
    assert!(a.set_cookie.is_none());
    let a = console.post(
        "/ui/sign-in",
        Some(&console.base),
        None,
        &[("token", "wrong")],
    );
    assert_eq!(a.status, 401);
    let session = console.sign_in();
    let page = console.get("/ui/pools/new", Some(&session));
    assert_eq!(page.status, 200);
    let csrf = csrf_of(&page.body);
    let create = |origin: Option<&str>, cookie: Option<&str>, csrf: Option<&str>| {
        let mut form = vec![("yaml", POOL)];
        if let Some(c) = csrf {
            form.push(("csrf", c));
        }
        console.post("/ui/pools/new", origin, cookie, &form)
    };
    let base = console.base.clone();
    for (what, a) in [
        (
            "another site's Origin",
            create(Some(evil), Some(&session), Some(&csrf)),
        ),
        ("no Origin", create(None, Some(&session), Some(&csrf))),
        ("no CSRF token", create(Some(&base), Some(&session), None)),
        (
            "another CSRF token",
            create(Some(&base), Some(&session), Some("0123abcd")),
        ),
    ] {
        assert_eq!(a.status, 403, "{what}: {}", a.body);
    }
    for (what, origin, token) in [
        ("another site's Origin", Some(evil), Some(csrf.as_str())),
        ("no CSRF token", Some(base.as_str()), None),
    ] {
        for path in ["/ui/attach", "/ui/attach/manual"] {
            let mut form = vec![
                ("pool", "workers"),
                ("instance", owned.as_str()),
                ("action", "attach"),
                ("expires_seconds", "600"),
            ];
            if let Some(t) = token {
                form.push(("csrf", t));
            }
            let a = console.post(path, origin, Some(&session), &form);
            assert_eq!(a.status, 403, "{path}, {what}: {}", a.body);
        }
    }
    let a = create(Some(&base), None, Some(&csrf));
    assert_eq!(
        (a.status, a.location.as_deref()),
        (303, Some("/ui/sign-in")),
        "no cookie"
    );
    let pools = api.get("/api/v1/pools").unwrap();
    assert_eq!(
        pools["items"],
        serde_json::json!([]),
        "a refused POST made a pool"
    );
    // The answers' guards.
    let head = console
        .agent
        .get(&console.url("/ui/sign-in"))
        .call()
        .unwrap();
    let csp = head.header("content-security-policy").unwrap_or_default();
    assert!(
        csp.contains("frame-ancestors 'none'")
            && csp.contains("script-src 'sha256-")
            && !csp.contains("unsafe-inline"),
        "{csp}"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let driver = Driver::start(&env.path("chromedriver.log"));
    let artifacts = browser::artifacts_dir();
    rt.block_on(async {
        let client = driver.session().await;
        browser_sign_in(&client, &console).await;

        // Create the pool from YAML.
        submit_yaml(&client, &console, POOL).await;
        wait_for_url(&client, "/ui/pools?done=", Duration::from_secs(10)).await;
        let row = find_on_page(&client, Locator::Id("pool-workers")).await;
        assert!(row.text().await.unwrap().contains("workers"));

        // A bad document: refused with the field the API names.
        let (status, body) = api.raw("POST", "/api/v1/pools", Some(BAD_POOL)).unwrap();
        assert!((400..500).contains(&status), "{status} {body}");
        let refusal: Value = serde_json::from_str(&body).unwrap();
        let field = refusal["errors"][0]["field"].as_str().expect("a field error").to_string();
        let rule = refusal["errors"][0]["rule"].as_str().unwrap().to_string();
        submit_yaml(&client, &console, BAD_POOL).await;
        // The refusal is a new page: wait for it, the click may return first.
        let shown = client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(&format!(r#"#yaml-error li[data-field="{field}"]"#)))
            .await
            .unwrap_or_else(|e| panic!("no error at {field}: {e}"))
            .text()
            .await
            .unwrap();
        assert!(shown.contains(&field) && shown.contains(&rule), "{shown}");
        let textarea = js(&client, "return document.getElementById('yaml').value").await;
        assert_eq!(textarea.as_str(), Some(BAD_POOL), "the document is kept for fixing");
        assert!(api.get("/api/v1/pools/broken").is_err());

        // A bad scale: the API's own message.
        let (status, body) = api
            .raw("POST", "/api/v1/pools/workers/scale", Some(r#"{"replicas": -2}"#))
            .unwrap();
        assert!((400..500).contains(&status), "{status} {body}");
        let message: Value = serde_json::from_str(&body).unwrap();
        client.goto(&console.url("/ui/pools")).await.unwrap();
        scale_in_browser(&client, "-2").await;
        let shown = client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Id("scale-error-workers"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let first_line = message["message"].as_str().unwrap().lines().next().unwrap();
        let field_error = format!(
            "{}: {}",
            message["errors"][0]["field"].as_str().unwrap(),
            message["errors"][0]["rule"].as_str().unwrap()
        );
        assert!(
            shown.contains(first_line) && shown.contains(&field_error),
            "{shown} / {message}"
        );

        // Scale to 2 and watch, on the same page, both nodes get Ready.
        client.goto(&console.url("/ui/pools")).await.unwrap();
        scale_in_browser(&client, "2").await;
        live_page(&client, "/ui/pools?done=", "the scale").await;
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(480);
        loop {
            // Found anew each time: a live update replaces the cell.
            let ready = match client
                .find(Locator::Css(r#"#pool-workers td[data-col="ready"]"#))
                .await
            {
                Ok(cell) => cell.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if seen.last() != Some(&ready) {
                seen.push(ready.clone());
            }
            if ready == "2" {
                break;
            }
            if Instant::now() > deadline {
                let url = client.current_url().await.map(|u| u.to_string());
                let text = js(&client, "return document.body.innerText").await;
                panic!(
                    "the page never showed 2 Ready (seen {seen:?}) at {url:?}, showing:\n{}\nserver log:\n{}",
                    text.as_str().unwrap_or(""),
                    env.server_log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_same_document(&client).await;
        assert!(seen.len() >= 2, "no change was watched: {seen:?}");
        eprintln!("Ready count on the page, as it changed: {seen:?}");
        std::fs::write(
            artifacts.join("console-pools.png"),
            client.screenshot().await.unwrap(),
        )
        .unwrap();

        // A node is Ready after join; base-packages, os-config and hardening
        // run after it, so the timeline is whole only once both report
        // `initialized` (under CI load that can be seconds later).
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let nodes = api.get("/api/v1/nodes").unwrap();
            let initialized = nodes["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["pool"] == "workers" && n["initialized"] == true)
                .count();
            if initialized == 2 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the 2 Ready nodes never finished their post-join phases: {nodes}\nserver log:\n{}",
                env.server_log_tail()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

        // The nodes page, filtered by pool and status, then one node.
        client
            .goto(&console.url("/ui/nodes?pool=workers&status=Ready"))
            .await
            .unwrap();
        let links = client
            .find_all(Locator::Css("table.nodes tbody th a"))
            .await
            .unwrap();
        assert_eq!(links.len(), 2);
        let node = links[0].text().await.unwrap();
        links[0].click().await.unwrap();
        wait_for_url(&client, &format!("/ui/nodes/{node}"), Duration::from_secs(10)).await;
        let bars = js(
            &client,
            "return Array.from(document.querySelectorAll('svg.timeline g.bar')).map(function (g) { \
               return {phase: g.dataset.phase, cls: g.getAttribute('class'), tab: g.getAttribute('tabindex'), \
                       title: g.querySelector('title').textContent}; })",
        )
        .await;
        let bars = bars.as_array().unwrap().clone();
        let described = api.get(&format!("/api/v1/nodes/{node}")).unwrap();
        let mut phases: Vec<String> = described["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["phase"].as_str().unwrap().to_string())
            .collect();
        phases.dedup();
        phases.sort();
        phases.dedup();
        let mut drawn: Vec<String> = bars
            .iter()
            .map(|b| b["phase"].as_str().unwrap().to_string())
            .collect();
        drawn.sort();
        assert_eq!(drawn, phases, "one bar per phase the node reported");
        assert!(drawn.len() >= 9, "{drawn:?}");
        for b in &bars {
            assert_eq!(b["tab"], "0", "focusable: {b}");
            let class = b["cls"].as_str().unwrap();
            assert!(class.contains("done") || class.contains("skipped"), "{b}");
            assert!(b["title"].as_str().unwrap().contains(" in "), "{b}");
        }
        let init_log = client.find(Locator::Css("pre.log")).await.unwrap().text().await.unwrap();
        assert!(init_log.contains("[data-disk]"), "{init_log}");
        std::fs::write(
            artifacts.join("console-node.png"),
            client.screenshot().await.unwrap(),
        )
        .unwrap();

        // ---- add existing instances: the local cloud's instances in no pool.
        client.goto(&console.url("/ui/attach?pool=workers")).await.unwrap();
        let offered = js(
            &client,
            "return Array.from(document.querySelectorAll('table.candidates tbody tr')).map(function (r) { return r.dataset.instance; })",
        )
        .await;
        let offered: Vec<String> = serde_json::from_value(offered).unwrap();
        assert!(offered.contains(&owned) && offered.contains(&swappy), "{offered:?}");
        let members: Vec<String> = api.get("/api/v1/instances").unwrap()["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["providerId"].as_str().map(str::to_string))
            .collect();
        assert_eq!(members.len(), 2, "{members:?}");
        for m in &members {
            assert!(!offered.contains(m), "a pool's instance {m} offered: {offered:?}");
        }
        // Labelled for the keyboard and screen readers.
        let label = client
            .find(Locator::Css(&format!(r#"label[for="instance-{owned}"]"#)))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(label, "old-web");

        // The dry run: every check of both, as the API answers it.
        click(&client, &format!("#instance-{owned}")).await;
        click(&client, &format!("#instance-{swappy}")).await;
        submit(&client, r#"form.attach button[value="preflight"]"#).await;
        client
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css("#preflight"))
            .await
            .expect("the preflight's results");
        let shown = preflight_on_page(&client).await;
        let request = serde_json::json!({"instances": [owned, swappy], "dryRun": true}).to_string();
        let (status, body) = api
            .raw("POST", "/api/v1/pools/workers/attach", Some(&request))
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["passed"], false, "{answer}");
        assert_eq!(shown, preflight_of(&answer), "the page shows the API's checks");
        let bad: Vec<(String, String)> = shown[swappy.as_str()]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r[0] == "error")
            .map(|r| (r[1].as_str().unwrap().to_string(), r[3].as_str().unwrap().to_string()))
            .collect();
        let codes: Vec<&str> = bad.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(codes, ["PreflightSwapOn", "PreflightInstanceTypeNotInPool"], "{bad:?}");
        assert!(bad[0].1.contains("swapoff"), "the fix is shown: {bad:?}");
        assert!(
            shown[owned.as_str()].as_array().unwrap().iter().all(|r| r[0] != "error"),
            "{shown}"
        );
        let passed = js(&client, "return document.getElementById('preflight').dataset.passed").await;
        assert_eq!(passed, "false");

        // The page as the docs show it: the failing instance's checks.
        client
            .execute(
                "document.querySelector('table.preflight[data-instance=\"' + arguments[0] + '\"]').scrollIntoView(); return true;",
                vec![Value::String(swappy.clone())],
            )
            .await
            .unwrap();
        std::fs::write(
            artifacts.join("console-attach.png"),
            client.screenshot().await.unwrap(),
        )
        .unwrap();

        // Attach both: refused by the preflight, nothing changed.
        submit(&client, r#"form.attach button[value="attach"]"#).await;
        let verdict = client
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css("#preflight p.error"))
            .await
            .expect("a refusal")
            .text()
            .await
            .unwrap();
        assert!(verdict.contains("Not attached"), "{verdict}");
        assert_eq!(api.get("/api/v1/pools/workers").unwrap()["spec"]["replicas"], 2);

        // The good one alone, keeping its name: started, then followed on
        // the same page until its node is Ready.
        let ticked = |id: &str| format!("return document.getElementById('instance-{id}').checked");
        assert_eq!(js(&client, &ticked(&swappy)).await, Value::Bool(true), "the ticks are kept");
        click(&client, &format!("#instance-{swappy}")).await;
        click(&client, r#"form.attach input[name="keep_instance_name"]"#).await;
        let started = Instant::now();
        click(&client, r#"form.attach button[value="attach"]"#).await;
        live_page(&client, "/ui/attach?pool=workers&done=", "the attach").await;
        let notice = client
            .find(Locator::Id("attach-notice"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(notice.contains(&owned) && notice.contains("started"), "{notice}");
        let row = format!(r#"table.added tr[data-provider-id="{owned}"]"#);
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let cells = js(
                &client,
                &format!(
                    "var r = document.querySelector('{}'); if (!r) return null; \
                     return [r.querySelector('[data-col=state]').textContent, \
                             r.querySelector('[data-col=node]').textContent, \
                             r.querySelector('[data-col=node-status]').textContent];",
                    row.replace('\'', "\\'")
                ),
            )
            .await;
            if seen.last() != Some(&cells) {
                seen.push(cells.clone());
            }
            if cells[2] == "Ready" {
                assert_eq!(cells[1], "old-web", "the node keeps the instance's name");
                break;
            }
            if Instant::now() > deadline {
                let text = js(&client, "return document.body.innerText").await;
                panic!(
                    "the attached node never showed Ready (seen {seen:?}), showing:\n{}\nserver log:\n{}",
                    text.as_str().unwrap_or(""),
                    env.server_log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_same_document(&client).await;
        eprintln!(
            "automatic attach from the console to Ready: {:.1} s; the row as it changed: {seen:?}",
            started.elapsed().as_secs_f64()
        );
        let pool = api.get("/api/v1/pools/workers").unwrap();
        assert_eq!(pool["spec"]["replicas"], 3, "desired count +1");
        let node = api.get("/api/v1/nodes/old-web").unwrap();
        assert_eq!(node["status"], "Ready", "{node}");

        // The manual command: a bad lifetime refused with the API's message,
        // then the command, for this pool, whose token the server knows.
        let expires = client.find(Locator::Id("manual-expires")).await.unwrap();
        expires.clear().await.unwrap();
        expires.send_keys("0").await.unwrap();
        submit(&client, "form.attach-manual button").await;
        let (status, body) = api
            .raw("POST", "/api/v1/pools/workers/attach-script", Some(r#"{"expiresSeconds": 0}"#))
            .unwrap();
        assert!((400..500).contains(&status), "{status} {body}");
        let refusal: Value = serde_json::from_str(&body).unwrap();
        let shown = client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(r#"#manual-error li[data-field="expiresSeconds"]"#))
            .await
            .expect("the lifetime refused at its field")
            .text()
            .await
            .unwrap();
        assert!(
            shown.contains(refusal["errors"][0]["rule"].as_str().unwrap()),
            "{shown} / {refusal}"
        );
        let expires = client.find(Locator::Id("manual-expires")).await.unwrap();
        expires.clear().await.unwrap();
        expires.send_keys("600").await.unwrap();
        submit(&client, "form.attach-manual button").await;
        let command = client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Id("manual-command"))
            .await
            .expect("the manual command")
            .prop("value")
            .await
            .unwrap()
            .unwrap_or_default();
        let token_id = client.find(Locator::Id("manual-token")).await.unwrap().text().await.unwrap();
        let b64 = command
            .strip_prefix("echo ")
            .and_then(|c| c.strip_suffix(" | base64 -d | bash"))
            .unwrap_or_else(|| panic!("the API's command form: {command}"));
        assert!(
            b64.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b)),
            "one base64 word: {command}"
        );
        let decoded = std::process::Command::new("sh")
            .args(["-c", &format!("echo {b64} | base64 -d")])
            .output()
            .unwrap();
        assert!(decoded.status.success());
        let script = String::from_utf8(decoded.stdout).unwrap();
        assert!(script.contains(&format!("knitattach.{token_id}")), "the token is in the script");
        let syntax = std::process::Command::new("bash")
            .args(["-n", "-c", &script])
            .output()
            .unwrap();
        assert!(syntax.status.success(), "{}", String::from_utf8_lossy(&syntax.stderr));
        let tokens = api.get("/api/v1/jointokens").unwrap().to_string();
        assert!(tokens.contains(&token_id), "{tokens}");

        // A node whose removal a PodDisruptionBudget blocks: the nodes
        // page shows it draining with the budget, as `knit get nodes`
        // does, and its page the drain with the budget in full.
        let leaving = api.get("/api/v1/nodes").unwrap()["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["pool"] == "workers" && n["name"] != "old-web")
            .find_map(|n| n["name"].as_str().map(str::to_string))
            .expect("a node of workers");
        let kubeconfig = env.path("server/cluster/admin.kubeconfig");
        kubectl(
            &kubeconfig,
            &["create", "--validate=false", "-f", "-"],
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: web-0, labels: {{app: web}}}}\n\
                 spec: {{nodeName: {leaving}, terminationGracePeriodSeconds: 1, containers: [{{name: app, image: registry.local/web:1}}]}}\n\
                 ---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: web}}\n\
                 spec: {{minAvailable: 1, selector: {{matchLabels: {{app: web}}}}}}\n"
            ),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let b = kubectl(&kubeconfig, &["get", "pdb", "web", "-o", "json"], "");
            let b: Value = serde_json::from_str(&b).unwrap();
            if b["status"]["currentHealthy"] == 1 && b["status"]["disruptionsAllowed"] == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the budget never counted web-0: {b}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        env.knit_ok(&["delete", "node", &leaving]);
        let row = format!(r#"tr[data-node="{leaving}"] span[data-drain="Blocked"]"#);
        let deadline = Instant::now() + Duration::from_secs(90);
        let badge = loop {
            client.goto(&console.url("/ui/nodes?pool=workers")).await.unwrap();
            if let Ok(b) = client.find(Locator::Css(&row)).await {
                break b;
            }
            if Instant::now() > deadline {
                let text = js(&client, "return document.body.innerText").await;
                panic!("{leaving} never shown draining:\n{}\n{}", text.as_str().unwrap_or(""), env.server_log_tail());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        assert_eq!(badge.text().await.unwrap(), "Draining (default/web)");
        let title = badge.attr("title").await.unwrap().unwrap_or_default();
        assert!(title.contains("would violate the pod's disruption budget"), "{title}");
        let table = env.knit_ok(&["get", "nodes"]);
        assert!(
            table.lines().any(|l| l.starts_with(&leaving) && l.contains("Draining(default/web)")),
            "the CLI shows the same: {table}"
        );
        client.goto(&console.url(&format!("/ui/nodes/{leaving}"))).await.unwrap();
        let blocked_by = client
            .find(Locator::Css("[data-drain-section] [data-blocking-budget]"))
            .await
            .expect("the node's page names the budget")
            .text()
            .await
            .unwrap();
        assert!(
            blocked_by.starts_with("PodDisruptionBudget default/web (minAvailable 1"),
            "{blocked_by}"
        );
        std::fs::write(
            artifacts.join("console-drain.png"),
            client.screenshot().await.unwrap(),
        )
        .unwrap();
        // The budget goes: the removal ends on its own (waited for, so
        // that what follows runs on a quiet pool as before).
        kubectl(&kubeconfig, &["delete", "pdb", "web"], "");
        let deadline = Instant::now() + Duration::from_secs(120);
        while api.get(&format!("/api/v1/nodes/{leaving}")).is_ok() {
            assert!(Instant::now() < deadline, "{leaving} never removed:\n{}", env.server_log_tail());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

        // The events page: newest first.
        client.goto(&console.url("/ui/events?kind=NodePool")).await.unwrap();
        let events = client.find(Locator::Css("table.events")).await.unwrap().text().await.unwrap();
        assert!(events.contains("workers"), "{events}");

        // Sign out: the session is gone, in the browser and for its cookie.
        let cookie = client
            .get_named_cookie(COOKIE)
            .await
            .unwrap()
            .value()
            .to_string();
        client
            .find(Locator::Css("form.sign-out button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_for_url(&client, "/ui/sign-in", Duration::from_secs(10)).await;
        client.goto(&console.url("/ui/pools")).await.unwrap();
        wait_for_url(&client, "/ui/sign-in", Duration::from_secs(10)).await;
        let a = console.get("/ui/pools", Some(&cookie));
        assert_eq!(a.location.as_deref(), Some("/ui/sign-in"), "a signed-out cookie");
        client.close().await.unwrap();
    });

    // ---- a session expires (a server with 3-second sessions)
    env.kill_server();
    env.set_env("KNIT_CONSOLE_SESSION_TTL", Some("3"));
    env.start_server();
    let session = console.sign_in();
    assert_eq!(console.get("/ui/pools", Some(&session)).status, 200);
    rt.block_on(async {
        let client = driver.session().await;
        browser_sign_in(&client, &console).await;
        // The open page learns it over the live feed and goes to sign-in.
        wait_for_url(&client, "/ui/sign-in", Duration::from_secs(15)).await;
        client.close().await.unwrap();
    });
    let a = console.get("/ui/pools", Some(&session));
    assert_eq!(
        a.location.as_deref(),
        Some("/ui/sign-in"),
        "an expired session"
    );
    drop(driver);
}

/// Where `browser_holder` reports its chromedriver's PID and profile.
const HOLDER_REPORT: &str = "KNIT_BROWSER_HOLDER_REPORT";

/// Not a test of its own: the test process that
/// `the_browser_ends_with_the_test_process` kills. Starts chromedriver and
/// a Chromium with a session, reports them, and waits to be killed.
#[test]
#[ignore = "a helper process, run by the_browser_ends_with_the_test_process"]
fn browser_holder() {
    let report =
        std::env::var_os(HOLDER_REPORT).expect("run by the_browser_ends_with_the_test_process");
    let report = std::path::PathBuf::from(report);
    let driver = Driver::start(&report.with_extension("log"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _client = rt.block_on(async {
        let client = driver.session().await;
        client.goto("about:blank").await.unwrap();
        client
    });
    let line = format!("{} {}\n", driver.pid(), driver.profile().display());
    std::fs::write(report.with_extension("tmp"), line).unwrap();
    std::fs::rename(report.with_extension("tmp"), &report).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Running, not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// A test process ended by SIGTERM (the test runner past its timeout) or
/// SIGKILL, with no destructor run, takes chromedriver and Chromium with
/// it: they ran in a process group of their own, which the guardian kills
/// when the test process's pipe closes; it then removes the profile.
#[test]
fn the_browser_ends_with_the_test_process() {
    browser::require_chromium();
    let dir = tempfile::Builder::new()
        .prefix("knit-browser-holder-")
        .tempdir()
        .unwrap();
    for (name, signal) in [("SIGTERM", libc::SIGTERM), ("SIGKILL", libc::SIGKILL)] {
        let report = dir.path().join(format!("holder-{name}"));
        let mut holder = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "browser_holder", "--nocapture"])
            .env(HOLDER_REPORT, &report)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(report.with_extension("err")).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let text = loop {
            if let Ok(t) = std::fs::read_to_string(&report) {
                break t;
            }
            if let Ok(Some(status)) = holder.try_wait() {
                panic!(
                    "the holder ended ({status}): {}",
                    std::fs::read_to_string(report.with_extension("err")).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                let _ = holder.kill();
                panic!("the holder never reported its browser");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let (pid, profile) = text.trim().split_once(' ').unwrap();
        let pid: u32 = pid.parse().unwrap();
        assert!(alive(pid), "chromedriver {pid} runs");
        assert!(!browser::pids_with(profile).is_empty(), "Chromium runs");
        // SAFETY: kill(2) on the holder this test started (not yet reaped).
        unsafe { libc::kill(holder.id() as i32, signal) };
        holder.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = browser::pids_with(profile);
            if !alive(pid) && left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "after {name} to the test process: chromedriver {pid} alive: {}, Chromium left: {left:?}",
                alive(pid)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Its profile directory too (the guardian's last step).
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(profile).exists() {
            assert!(Instant::now() < deadline, "{profile} left after {name}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
