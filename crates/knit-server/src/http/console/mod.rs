//! The web console under `/ui/`, served on its own TLS port
//! (`Settings::console`). Every action calls the same domain functions as
//! the REST API (`crate::pools`, `crate::nodes`, …), so the console can do
//! nothing the API would refuse, with the same validation and messages.
//!
//! Security: sign-in with any API token (in a POST body, never a URL)
//! makes a session ([`session`]) with the token's role; every other page
//! needs one (else a 303 to the sign-in page) and declares the role it
//! needs (`signed_in_routes`; pages hide what the role may not do, and the
//! server refuses it anyway), and every POST must come from the console's
//! own origin and carry the session's CSRF token. Answers forbid framing,
//! inline scripts and caching.

mod attach;
mod events;
mod html;
mod live;
mod nodes;
mod pools;
pub mod session;
mod snapshots;

use super::auth;
use crate::control::ControlPlane;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Form, Router};
use html::{page, see_other, Section};
use knit_api::state::TokenRole;
use maud::html;
use serde::Deserialize;
use session::{Session, Sessions, CSRF_FIELD, CSRF_HEADER};
use std::sync::Arc;
use std::time::Duration;

/// What every console handler shares.
pub struct Console {
    pub cp: Arc<ControlPlane>,
    pub sessions: Sessions,
    pub live: live::Live,
}

type Cs = Arc<Console>;

/// The largest form the console takes (a pool's YAML is far smaller).
const MAX_FORM_BYTES: usize = 256 * 1024;

/// The stylesheet and the live-update script, inlined in every page and
/// allowed by their hashes in the Content-Security-Policy. As separate
/// files a page could come without them: a browser aborts loads in flight
/// when the host's network changes (`ERR_NETWORK_CHANGED`, as when a local
/// cloud adds a machine's veth), and that page then never updated live.
pub(crate) const CSS: &str = include_str!("../../../console/console.css");
pub(crate) const JS: &str = include_str!("../../../console/console.js");

/// The policy: nothing but the console itself, its one script and its one
/// stylesheet by hash.
static CSP: std::sync::LazyLock<HeaderValue> = std::sync::LazyLock::new(|| {
    let policy = format!(
        "default-src 'self'; script-src '{}'; style-src '{}'; img-src 'self' data:; \
         connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        csp_hash(JS),
        csp_hash(CSS)
    );
    HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("default-src 'none'"))
});

/// `sha256-<base64>` of an inline script or style, as CSP names it.
fn csp_hash(text: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    format!(
        "sha256-{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The console's router and the task that feeds its live updates (it ends
/// when `shutdown` turns true).
pub fn router(
    cp: Arc<ControlPlane>,
    session_ttl: Duration,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> (Router, tokio::task::JoinHandle<()>) {
    let (live, feed) = live::Live::start(cp.clone(), shutdown);
    let console = Arc::new(Console {
        cp,
        sessions: Sessions::new(session_ttl),
        live,
    });
    let (signed_in, table) = signed_in_routes().finish();
    let signed_in = signed_in.route_layer(middleware::from_fn_with_state(
        (console.clone(), auth::Table::new(&table)),
        require_session,
    ));
    let app = Router::new()
        .merge(signed_in)
        .route("/", get(|| async { see_other("/ui/pools") }))
        .route("/ui", get(|| async { see_other("/ui/pools") }))
        .route("/ui/", get(|| async { see_other("/ui/pools") }))
        .route("/ui/sign-in", get(sign_in_form).post(sign_in))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(middleware::from_fn(guard_headers))
        .with_state(console);
    (app, feed)
}

/// The pages behind sign-in, each with the role it needs (the same as the
/// API route it stands for; reading pages: viewer).
pub(crate) fn signed_in_routes() -> auth::Routes<Cs> {
    use auth::Access::Role;
    use knit_api::state::TokenRole::{Operator, Viewer};
    auth::Routes::default()
        .get("/ui/pools", Role(Viewer), pools::list)
        .get("/ui/pools/new", Role(Operator), pools::new_form)
        .post("/ui/pools/new", Role(Operator), pools::create)
        .post("/ui/pools/:name/scale", Role(Operator), pools::scale)
        .get("/ui/pools/:name/edit", Role(Operator), pools::edit_form)
        .post("/ui/pools/:name/edit", Role(Operator), pools::apply)
        .get("/ui/pools/:name/delete", Role(Operator), pools::delete_form)
        .post("/ui/pools/:name/delete", Role(Operator), pools::delete)
        // Its logs only for an admin (the page leaves them out otherwise).
        .get("/ui/nodes", Role(Viewer), nodes::list)
        .get("/ui/nodes/:name", Role(Viewer), nodes::node)
        .get("/ui/events", Role(Viewer), events::list)
        .get("/ui/snapshots", Role(Viewer), snapshots::list)
        .get("/ui/snapshot-builds/:id", Role(Viewer), snapshots::build)
        .get("/ui/attach", Role(Operator), attach::show)
        .post("/ui/attach", Role(Operator), attach::attach)
        // GET too: a page answered to the POST refreshes itself live.
        .get("/ui/attach/manual", Role(Operator), attach::show)
        .post("/ui/attach/manual", Role(Operator), attach::manual)
        .get("/ui/live", Role(Viewer), live::stream)
        .post("/ui/sign-out", Role(Viewer), sign_out)
}

/// Headers on every console answer: no framing, scripts and styles from
/// the console alone, nothing cached, no referrer leaving the console.
async fn guard_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, CSP.clone());
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // same-origin, not no-referrer: under no-referrer a browser sends
    // `Origin: null` with the console's own forms, failing the origin check.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// A 403 page saying why a request was refused.
fn refused(why: &str) -> Response {
    page(
        StatusCode::FORBIDDEN,
        Section::SignIn,
        "Refused",
        None,
        html! {
            p.error role="alert" { (why) }
            p { a href="/ui/pools" { "Back to the console" } }
        },
    )
}

/// Needs a live session (else a 303 to the sign-in page); a POST must also
/// come from the console's own origin and carry the session's CSRF token
/// (form field `csrf` or header `X-CSRF-Token`). The session is handed to
/// the handler as an extension.
///
/// The session's token must still be live (else the session ends), and its
/// role must reach the role the page declares (else a 403 page).
async fn require_session(
    State((console, table)): State<(Cs, auth::Table)>,
    request: Request,
    next: Next,
) -> Response {
    let session = session::cookie_id(request.headers()).and_then(|id| console.sessions.get(&id));
    let session = match session.map(|s| {
        let live = crate::api_tokens::live_by_id(&console.cp, &s.token_id);
        (s, live)
    }) {
        Some((s, Ok(Some(_)))) => Some(s),
        Some((s, Ok(None))) => {
            // Revoked or expired: the session goes with it.
            console.sessions.remove(&s.id);
            None
        }
        Some((_, Err(e))) => {
            let _ = axum::body::to_bytes(request.into_body(), MAX_FORM_BYTES).await;
            return refused(&format!("the session's token could not be checked: {e}"));
        }
        None => None,
    };
    let Some(session) = session else {
        let _ = axum::body::to_bytes(request.into_body(), MAX_FORM_BYTES).await;
        return see_other("/ui/sign-in");
    };
    let needs = match table.access_of(&request) {
        auth::Declared::Access(auth::Access::Role(r)) => r,
        // Every signed-in page declares a role; anything else is refused.
        _ => TokenRole::Admin,
    };
    if !session.may(needs) {
        let _ = axum::body::to_bytes(request.into_body(), MAX_FORM_BYTES).await;
        return refused(&format!(
            "this page needs a token of role {needs} or higher; you signed in with token {} (role {})",
            session.token_id, session.role
        ));
    }
    if request.method() == Method::GET || request.method() == Method::HEAD {
        let mut request = request;
        request.extensions_mut().insert(session);
        return next.run(request).await;
    }
    // The body is read before any refusal, so the connection stays usable.
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM_BYTES).await else {
        return refused("the form could not be read (too large?)");
    };
    if !session::same_origin(&parts.headers, &parts.uri) {
        return refused("this request did not come from the console's own page (its Origin is missing or another site's)");
    }
    let from_header = parts
        .headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let from_form = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&bytes)
        .ok()
        .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == CSRF_FIELD))
        .map(|(_, v)| v);
    match from_header.or(from_form) {
        Some(token) if session.csrf_matches(&token) => {}
        _ => return refused("this form's CSRF token is missing or not this session's"),
    }
    parts.extensions.insert(session);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

async fn not_found(uri: axum::http::Uri) -> Response {
    page(
        StatusCode::NOT_FOUND,
        Section::SignIn,
        "Not found",
        None,
        html! {
            p { "Nothing at " code { (uri.path()) } "." }
            p { a href="/ui/pools" { "Pools" } }
        },
    )
}

fn sign_in_page(status: StatusCode, message: Option<&str>) -> Response {
    page(
        status,
        Section::SignIn,
        "Sign in",
        None,
        html! {
            @if let Some(m) = message {
                p.error #sign-in-error role="alert" { (m) }
            }
            form.sign-in method="post" action="/ui/sign-in" {
                label for="token" { "API token" }
                input #token name="token" type="password" autocomplete="off" required autofocus aria-describedby="token-help";
                p #token-help .help {
                    "An API token (" code { "knit token create" } "; the first admin token is the file "
                    code { "admin-token" } " in the server's state directory, or " code { "token:" }
                    " in your client config). The console offers what its role may do."
                }
                button type="submit" { "Sign in" }
            }
        },
    )
}

async fn sign_in_form(State(console): State<Cs>, headers: axum::http::HeaderMap) -> Response {
    // Already signed in: straight to the pools.
    if session::cookie_id(&headers).is_some_and(|id| console.sessions.get(&id).is_some()) {
        return see_other("/ui/pools");
    }
    sign_in_page(StatusCode::OK, None)
}

#[derive(Deserialize)]
struct SignInForm {
    #[serde(default)]
    token: String,
}

/// Checks the admin token (from the form body) and makes a session. Only
/// from the console's own origin: another site cannot sign a browser in.
async fn sign_in(
    State(console): State<Cs>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
    Form(form): Form<SignInForm>,
) -> Response {
    if !session::same_origin(&headers, &uri) {
        return refused("this sign-in did not come from the console's own page");
    }
    let token = match crate::api_tokens::authenticate(&console.cp, Some(form.token.trim())) {
        Ok(t) => t,
        Err(crate::error::ServerError::Unauthorized(why)) => {
            return sign_in_page(
                StatusCode::UNAUTHORIZED,
                Some(&format!("That token is refused: {why}.")),
            )
        }
        Err(e) => return sign_in_page(StatusCode::SERVICE_UNAVAILABLE, Some(&e.to_string())),
    };
    let left = token
        .expires_ms
        .map(|e| Duration::from_millis(e.saturating_sub(crate::store::now_ms()).max(0) as u64));
    let session = match console.sessions.create(&token.id, token.role, left) {
        Ok(s) => s,
        Err(e) => return sign_in_page(StatusCode::INTERNAL_SERVER_ERROR, Some(&e.to_string())),
    };
    let mut response = see_other("/ui/pools");
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&session, console.sessions.ttl())) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

async fn sign_out(State(console): State<Cs>, Extension(session): Extension<Session>) -> Response {
    console.sessions.remove(&session.id);
    let mut response = see_other("/ui/sign-in");
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

#[cfg(test)]
mod policy_tests {
    use super::*;

    /// A browser runs the inlined script and applies the inlined style only
    /// when their hashes are the ones the policy names.
    #[test]
    fn the_policy_allows_exactly_the_inlined_script_and_style() {
        let csp = CSP.to_str().unwrap();
        assert!(
            csp.contains(&format!("script-src '{}'", csp_hash(JS))),
            "{csp}"
        );
        assert!(
            csp.contains(&format!("style-src '{}'", csp_hash(CSS))),
            "{csp}"
        );
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        // The known value of sha256("") in CSP's form.
        assert_eq!(
            csp_hash(""),
            "sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
    }
}

#[cfg(test)]
mod role_tests {
    use super::*;
    use axum::http::Request as HttpRequest;
    use tower::ServiceExt;

    const HOST: &str = "console.test:7444";

    async fn send(
        app: &Router,
        method: Method,
        path: &str,
        cookie: Option<&str>,
        form: Option<String>,
    ) -> (StatusCode, Option<String>, String) {
        let mut request = HttpRequest::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, HOST)
            .header(header::ORIGIN, format!("https://{HOST}"));
        if let Some(c) = cookie {
            request = request.header(header::COOKIE, c);
        }
        let body = match form {
            Some(f) => {
                request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
                Body::from(f)
            }
            None => Body::empty(),
        };
        let response = app
            .clone()
            .oneshot(request.body(body).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let cookie = response
            .headers()
            .get(header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(str::to_string);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, cookie, String::from_utf8_lossy(&bytes).into_owned())
    }

    fn form(pairs: &[(&str, &str)]) -> String {
        serde_urlencoded::to_string(pairs).unwrap()
    }

    /// A control plane on an in-memory store with a cluster and the first
    /// admin token (`admin_secret`); the directory holds its state.
    fn signed_in_control_plane(admin_secret: &str) -> (tempfile::TempDir, Arc<ControlPlane>) {
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(ControlPlane::new(
            crate::store::Store::open_in_memory().unwrap(),
            None,
            Arc::new(crate::cluster::seam::NoCluster),
            crate::control::Settings::new(dir.path().join("state")),
            String::new(),
            admin_secret.into(),
            String::new(),
        ));
        cp.store.put_cluster(&knit_api::Cluster::default()).unwrap();
        crate::api_tokens::seed_first_admin(&cp).unwrap();
        (dir, cp)
    }

    /// Any token signs in; a viewer's pages offer no change and the server
    /// refuses one anyway; a revoked token ends its session; an admin's
    /// pages offer everything.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_console_offers_and_allows_what_the_role_may() {
        let (_state_dir, cp) = signed_in_control_plane("first-admin-secret");
        let viewer = crate::api_tokens::create(
            &cp,
            &knit_api::views::TokenCreateRequest {
                role: TokenRole::Viewer,
                ttl_seconds: None,
                description: "console viewer".into(),
            },
        )
        .unwrap();
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let (app, _feed) = router(cp.clone(), Duration::from_secs(600), shutdown);

        let (status, _, body) = send(
            &app,
            Method::POST,
            "/ui/sign-in",
            None,
            Some(form(&[("token", "not-a-token")])),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");

        let (status, cookie, _) = send(
            &app,
            Method::POST,
            "/ui/sign-in",
            None,
            Some(form(&[("token", &viewer.secret)])),
        )
        .await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        let cookie = cookie.expect("a session cookie");
        let (status, _, page) = send(&app, Method::GET, "/ui/pools", Some(&cookie), None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            !page.contains("/ui/pools/new"),
            "a viewer is offered a pool: {page}"
        );
        assert!(!page.contains(r#"href="/ui/attach""#), "{page}");
        let csrf = page
            .split(r#"name="csrf" value=""#)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the sign-out form's CSRF token")
            .to_string();
        let (status, _, _) = send(&app, Method::GET, "/ui/pools/new", Some(&cookie), None).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let yaml = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: v\nspec:\n  replicas: 0\n";
        let (status, _, page) = send(
            &app,
            Method::POST,
            "/ui/pools/new",
            Some(&cookie),
            Some(form(&[("csrf", &csrf), ("yaml", yaml)])),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
        assert!(page.contains("role operator"), "{page}");
        assert!(cp.store.pools().unwrap().is_empty(), "nothing was made");

        crate::api_tokens::revoke(&cp, &viewer.token.id).unwrap();
        let (status, _, _) = send(&app, Method::GET, "/ui/pools", Some(&cookie), None).await;
        assert_eq!(
            status,
            StatusCode::SEE_OTHER,
            "the revoked token's session ended"
        );

        let (_, admin, _) = send(
            &app,
            Method::POST,
            "/ui/sign-in",
            None,
            Some(form(&[("token", "first-admin-secret")])),
        )
        .await;
        let admin = admin.expect("a session cookie");
        let (status, _, page) = send(&app, Method::GET, "/ui/pools", Some(&admin), None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(page.contains("/ui/pools/new") && page.contains(r#"href="/ui/attach""#));
    }

    /// Markup and quotes in a pool or node name, an event, an error or a
    /// query value reach every page that shows them as text: the templates
    /// escape by default (names are checked on the way in, but the store
    /// and the provider are not trusted to have done so).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn markup_in_names_messages_and_queries_is_escaped_on_every_page() {
        const HOSTILE: &str = r#"<script>alert('x')</script>" onmouseover="alert(1)"#;
        // Error messages quote a value in Rust's way (`\"`): both forms
        // hold these.
        const ESCAPED: [&str; 2] = [
            "&lt;script&gt;alert('x')&lt;/script&gt;",
            "&quot; onmouseover=",
        ];
        let (_state_dir, cp) = signed_in_control_plane("escape-admin-secret");
        // Written past the API's name checks, straight into the store.
        let hostile_pool = knit_api::NodePool::new(HOSTILE, knit_api::NodePoolSpec::default());
        cp.store.insert_pool(&hostile_pool).unwrap();
        let instance = crate::store::InstanceRecord {
            name: "esc-i-1".into(),
            pool: HOSTILE.into(),
            provider_id: Some(HOSTILE.into()),
            state: knit_api::state::InstanceState::Running,
            ip: None,
            instance_type: "t".into(),
            report_token_hash: None,
            last_error: None,
            last_error_kind: None,
            created_ms: 0,
            updated_ms: 0,
            added: false,
        };
        for node in [HOSTILE, "esc-node-1"] {
            let failed = knit_api::PhaseEvent {
                node: node.into(),
                instance_id: "esc-i-1".into(),
                phase: knit_api::PhaseName::TimeSync,
                outcome: knit_api::PhaseOutcome::Failed,
                reason: Some(HOSTILE.into()),
                error_code: None,
                at_ms: 1_000,
                duration_ms: Some(10),
            };
            cp.store.record_phase_event(&instance, &failed).unwrap();
        }
        cp.store
            .add_event(
                knit_api::state::EventType::Warning,
                HOSTILE,
                HOSTILE,
                HOSTILE,
                HOSTILE,
            )
            .unwrap();
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let (app, _feed) = router(cp.clone(), Duration::from_secs(600), shutdown);
        let (_, cookie, _) = send(
            &app,
            Method::POST,
            "/ui/sign-in",
            None,
            Some(form(&[("token", "escape-admin-secret")])),
        )
        .await;
        let cookie = cookie.expect("a session cookie");
        let q = html::query_value(HOSTILE);
        let pages = [
            // The pool's row, its scale form and a notice from the query.
            format!("/ui/pools?done={q}"),
            // The node list: node and pool names, the error.
            "/ui/nodes".to_string(),
            format!("/ui/nodes?pool={q}"),
            // A node page: its pool, error and timeline reason.
            "/ui/nodes/esc-node-1".to_string(),
            // A name the API refuses: the error block quotes it.
            format!("/ui/nodes/{q}"),
            // Every event field, and the filters typed back into the form.
            format!("/ui/events?kind={q}&reason={q}&object={q}"),
            "/ui/events".to_string(),
            // The pool in the pickers, and a notice from the query.
            format!("/ui/attach?pool={q}&done={q}"),
            format!("/ui/pools/{q}/delete"),
            format!("/ui/pools/{q}/edit"),
        ];
        for path in pages {
            let (status, _, page) = send(&app, Method::GET, &path, Some(&cookie), None).await;
            assert!(
                status.is_success() || status.is_client_error(),
                "{path}: {status}"
            );
            assert!(
                ESCAPED.iter().all(|e| page.contains(e)),
                "{path} does not show the value: {page}"
            );
            assert!(
                !page.contains("<script>alert") && !page.contains(r#"" onmouseover="#),
                "{path} let markup through: {page}"
            );
        }
    }
}
