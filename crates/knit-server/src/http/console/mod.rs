//! The web console under `/ui/`, served on its own TLS port
//! (`Settings::console`). Every action calls the same domain functions as
//! the REST API (`crate::pools`, `crate::nodes`, …), so the console can do
//! nothing the API would refuse, with the same validation and messages.
//!
//! Security: sign-in with the admin token (in a POST body, never a URL)
//! makes a session ([`session`]); every other page needs one (else a 303 to
//! the sign-in page), and every POST must come from the console's own
//! origin and carry the session's CSRF token. Answers forbid framing,
//! inline scripts and caching.

mod attach;
mod events;
mod html;
mod live;
mod nodes;
mod pools;
pub mod session;
mod snapshots;

use crate::control::ControlPlane;
use crate::pki;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Form, Router};
use html::{page, see_other, Section};
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
    let signed_in = Router::new()
        .route("/ui/pools", get(pools::list))
        .route("/ui/pools/new", get(pools::new_form).post(pools::create))
        .route("/ui/pools/:name/scale", post(pools::scale))
        .route(
            "/ui/pools/:name/edit",
            get(pools::edit_form).post(pools::apply),
        )
        .route(
            "/ui/pools/:name/delete",
            get(pools::delete_form).post(pools::delete),
        )
        .route("/ui/nodes", get(nodes::list))
        .route("/ui/nodes/:name", get(nodes::node))
        .route("/ui/events", get(events::list))
        .route("/ui/snapshots", get(snapshots::list))
        .route("/ui/snapshot-builds/:id", get(snapshots::build))
        .route("/ui/attach", get(attach::show).post(attach::attach))
        // GET too: a page answered to the POST refreshes itself live.
        .route("/ui/attach/manual", get(attach::show).post(attach::manual))
        .route("/ui/live", get(live::stream))
        .route("/ui/sign-out", post(sign_out))
        .route_layer(middleware::from_fn_with_state(
            console.clone(),
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
        &format!(
            r#"<p class="error" role="alert">{}</p><p><a href="/ui/pools">Back to the console</a></p>"#,
            html::esc(why)
        ),
    )
}

/// Needs a live session (else a 303 to the sign-in page); a POST must also
/// come from the console's own origin and carry the session's CSRF token
/// (form field `csrf` or header `X-CSRF-Token`). The session is handed to
/// the handler as an extension.
async fn require_session(State(console): State<Cs>, request: Request, next: Next) -> Response {
    let session = session::cookie_id(request.headers()).and_then(|id| console.sessions.get(&id));
    let Some(session) = session else {
        let _ = axum::body::to_bytes(request.into_body(), MAX_FORM_BYTES).await;
        return see_other("/ui/sign-in");
    };
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
        &format!(
            r#"<p>Nothing at <code>{}</code>.</p><p><a href="/ui/pools">Pools</a></p>"#,
            html::esc(uri.path())
        ),
    )
}

fn sign_in_page(status: StatusCode, message: Option<&str>) -> Response {
    let message = message
        .map(|m| {
            format!(
                r#"<p class="error" id="sign-in-error" role="alert">{}</p>"#,
                html::esc(m)
            )
        })
        .unwrap_or_default();
    page(
        status,
        Section::SignIn,
        "Sign in",
        None,
        &format!(
            r#"{message}<form method="post" action="/ui/sign-in" class="sign-in">
<label for="token">Admin token</label>
<input id="token" name="token" type="password" autocomplete="off" required autofocus aria-describedby="token-help">
<p id="token-help" class="help">The server's admin token (the file <code>admin-token</code> in its state directory, or <code>token:</code> in your client config).</p>
<button type="submit">Sign in</button>
</form>"#
        ),
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
    if !pki::secrets_equal(form.token.trim(), &console.cp.admin_token) {
        return sign_in_page(
            StatusCode::UNAUTHORIZED,
            Some("That is not this server's admin token."),
        );
    }
    let session = match console.sessions.create() {
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
