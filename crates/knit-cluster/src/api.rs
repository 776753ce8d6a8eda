//! The HTTP API: routing of Kubernetes paths, authentication, authorization
//! and the verbs (get, list, watch, create, update, patch, delete).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};

use crate::auth::{self, Identity, Scope, Verb};
use crate::error::ApiStatus;
use crate::metrics::Metrics;
use crate::resources::{self, ResourceDef};
use crate::selector::Selector;
use crate::store::{
    Change, EventType, ListedBody, SnapshotError, Store, MAX_OBJECT_BYTES, NODE_LEASE_NAMESPACE,
};
use crate::table::{self, Include};
use crate::{admission, paging, patch, pods, tokens, util};

/// Largest request body accepted (kube-apiserver's limit: 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// How much of a body over the limit is still read (and discarded) so that
/// the client, which may not read before it has sent everything, gets the
/// 413 instead of a reset connection. Beyond this the connection is closed.
const DRAIN_LIMIT: usize = 64 * 1024 * 1024;
/// Requests slower than this are logged as a warning.
const SLOW_REQUEST: Duration = Duration::from_secs(1);

pub struct AppState {
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub server_address: String,
    pub bookmark_interval: Duration,
    pub shutdown: watch::Receiver<bool>,
}

/// The verified client certificate of this connection, if any.
#[derive(Clone, Debug, Default)]
pub struct PeerIdentity(pub Option<crate::pki::ClientCert>);

impl IntoResponse for ApiStatus {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry_after = self
            .details
            .as_ref()
            .and_then(|d| d["retryAfterSeconds"].as_u64())
            .filter(|s| *s > 0);
        let mut r = json_response(code, &self.body());
        if let Some(s) = retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(s));
        }
        r
    }
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

pub async fn handle(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let peer = parts
        .extensions
        .get::<PeerIdentity>()
        .cloned()
        .unwrap_or_default();
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let started = std::time::Instant::now();
    let query: HashMap<String, String> =
        parts.uri.query().map(url_decode_pairs).unwrap_or_default();
    let response = match read_body(&parts.headers, body).await {
        // The store (SQLite) and the patch and admission work run on the
        // blocking pool: a slow disk or a large object never holds up the
        // async workers that accept, read and answer every other request.
        Ok(body) => match in_place(&st, &method, &path, &query, &parts.headers, &body) {
            InPlace::Read => serve(&st, &method, &path, &query, &parts.headers, &peer, body)
                .unwrap_or_else(IntoResponse::into_response),
            // A write that cannot wait (see `Store::writes_in_place`): its
            // datastore work without the hand-off of this worker either.
            InPlace::Write => knit_db::run_in_place(|| {
                serve(&st, &method, &path, &query, &parts.headers, &peer, body)
            })
            .unwrap_or_else(IntoResponse::into_response),
            InPlace::No => {
                let (st2, method2, path2, query2) =
                    (st.clone(), method.clone(), path.clone(), query.clone());
                let headers = parts.headers.clone();
                let work = tokio::task::spawn_blocking(move || {
                    serve(&st2, &method2, &path2, &query2, &headers, &peer, body)
                        .unwrap_or_else(IntoResponse::into_response)
                });
                match work.await {
                    Ok(r) => r,
                    Err(e) => {
                        ApiStatus::internal(format!("request handler failed: {e}")).into_response()
                    }
                }
            }
        },
        Err(too_large) => too_large,
    };
    let code = response.status().as_u16();
    let (verb, resource) = labels(&st, &method, &path, &query);
    let took = started.elapsed();
    if took > SLOW_REQUEST {
        tracing::warn!(%method, %path, verb, resource = %resource, status = code, took_ms = took.as_millis() as u64, "slow API request");
    }
    st.metrics.record(verb, resource, code, took);
    tracing::debug!(%method, %path, status = code, "request");
    response
}

/// A request answered on the async worker that read it, without the
/// hand-off to the blocking pool and back (four thread wake-ups, most of
/// what a small request costs), by a client certificate's identity: a
/// read of one object that memory serves (a kubelet's read of its Node
/// every 10 s), and a kubelet's heartbeat (the update of its node Lease)
/// when the store writes in place. Anything that may wait on the
/// datastore goes to the pool.
fn in_place(
    st: &AppState,
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> InPlace {
    if headers.contains_key(header::AUTHORIZATION) {
        return InPlace::No;
    }
    let target = match route(st, path) {
        Ok(Route::Resource(t)) if t.name.is_some() && t.sub.is_none() => t,
        _ => return InPlace::No,
    };
    let read = *method == Method::GET
        && !is_true(query.get("watch"))
        && get_min_rv(query).is_ok_and(|min| st.store.serves_from_memory(min));
    let heartbeat = *method == Method::PUT
        && target.def.plural == "leases"
        && target.ns.as_deref() == Some(NODE_LEASE_NAMESPACE)
        && body.len() <= IN_PLACE_BODY;
    if read {
        InPlace::Read
    } else if heartbeat && st.store.writes_in_place() {
        InPlace::Write
    } else {
        InPlace::No
    }
}

/// Where a request is served (see [`in_place`]).
enum InPlace {
    /// On the async worker: a read memory answers.
    Read,
    /// On the async worker, its datastore work too: a write that cannot
    /// wait.
    Write,
    /// On the blocking pool.
    No,
}

/// The largest request body served in place (a node Lease is under 1 KiB).
const IN_PLACE_BODY: usize = 16 * 1024;

/// A get's `resourceVersion`, as kube-apiserver reads it: unset is the
/// newest, "0" any (a kubelet's first read of its Node), N no older than N.
fn get_min_rv(query: &HashMap<String, String>) -> Result<Option<u64>, ApiStatus> {
    match query.get("resourceVersion").map(String::as_str) {
        None | Some("") => Ok(None),
        Some(rv) => paging::parse_rv(rv).map(Some),
    }
}

fn too_large(what: String) -> Response {
    let mut r = ApiStatus::new(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", what)
        .into_response();
    // The rest of an oversized body is not read: this connection ends.
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// The request body, at most `MAX_BODY` bytes; otherwise a 413 naming the
/// limit. A body over the limit is still read to its end (up to
/// `DRAIN_LIMIT`) before answering, so that a client that sends it all
/// before reading gets the answer rather than a reset.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    use futures_util::StreamExt;
    let limit_msg = |size: String| {
        format!("request entity too large: the request body is {size} bytes; the limit is {MAX_BODY} bytes (3 MiB)")
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > MAX_BODY as u64) {
        if n > DRAIN_LIMIT as u64 {
            return Err(too_large(limit_msg(n.to_string())));
        }
    }
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut total: usize = 0;
    let read_all = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiStatus::bad_request(format!("reading the request body: {e}")).into_response()
            })?;
            total += chunk.len();
            if total <= MAX_BODY {
                buf.extend_from_slice(&chunk);
            } else {
                buf = Vec::new();
                if total > DRAIN_LIMIT {
                    return Err(too_large(limit_msg(format!("over {DRAIN_LIMIT}"))));
                }
            }
        }
        Ok(())
    };
    // A client that stops sending mid-body does not hold the request forever.
    match tokio::time::timeout(Duration::from_secs(60), read_all).await {
        Ok(Ok(())) => {}
        Ok(Err(r)) => return Err(r),
        Err(_) => {
            return Err(ApiStatus::new(
                StatusCode::REQUEST_TIMEOUT,
                "Timeout",
                "the request body was not received within 60 s",
            )
            .into_response())
        }
    }
    if total > MAX_BODY {
        return Err(too_large(limit_msg(total.to_string())));
    }
    Ok(Bytes::from(buf))
}

/// A query string's pairs (`+` is a space, bad escapes stay as written,
/// invalid UTF-8 is replaced); of a repeated name the last one counts.
fn url_decode_pairs(q: &str) -> HashMap<String, String> {
    form_urlencoded::parse(q.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn authenticate(
    st: &AppState,
    headers: &HeaderMap,
    peer: &PeerIdentity,
) -> Result<Identity, ApiStatus> {
    if let Some(h) = headers.get(header::AUTHORIZATION) {
        let bad = || ApiStatus::unauthorized("Unauthorized: invalid bearer token");
        let token = h
            .to_str()
            .map_err(|_| bad())?
            .strip_prefix("Bearer ")
            .ok_or_else(bad)?
            .trim();
        if !knit_api::validate::is_bootstrap_token(token) {
            return Err(bad());
        }
        let (id, secret) = token.split_once('.').ok_or_else(bad)?;
        let stored =
            st.store
                .get_served("secrets", "kube-system", &tokens::secret_name(id), None)?;
        let extra = tokens::verify(stored.as_deref(), secret)?;
        let mut groups = vec![tokens::BOOTSTRAPPERS.to_string()];
        groups.extend(extra);
        groups.push("system:authenticated".into());
        return Ok(Identity {
            user: format!("system:bootstrap:{id}"),
            groups,
        });
    }
    if let Some(cert) = &peer.0 {
        // A node knit removed keeps no working credential.
        if let Some(node) = st.store.revoked_node(&cert.serial) {
            return Err(ApiStatus::unauthorized(format!(
                "Unauthorized: the client certificate (serial {}) of node {node:?} was revoked when the node was deleted",
                cert.serial
            )));
        }
        let mut groups = cert.organizations.clone();
        groups.push("system:authenticated".into());
        return Ok(Identity {
            user: cert.common_name.clone(),
            groups,
        });
    }
    Ok(Identity::anonymous())
}

struct Target {
    def: &'static ResourceDef,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

/// Metric labels of a request: verb and resource (with subresource).
fn labels(
    st: &AppState,
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
) -> (&'static str, String) {
    match route(st, path) {
        Ok(Route::Resource(t)) => {
            let verb = match (method.as_str(), &t.name) {
                ("GET", None) if is_true(query.get("watch")) => "watch",
                ("GET", None) => "list",
                ("GET", Some(_)) => "get",
                ("POST", _) => "create",
                ("PUT", _) => "update",
                ("PATCH", _) => "patch",
                ("DELETE", _) => "delete",
                _ => "other",
            };
            let resource = match &t.sub {
                Some(sub) => format!("{}/{sub}", t.def.plural),
                None => t.def.plural.to_string(),
            };
            (verb, resource)
        }
        Ok(Route::Info(_)) => ("get", "info".into()),
        Ok(Route::Discovery(_)) => ("get", "discovery".into()),
        Ok(Route::Metrics) => ("get", "metrics".into()),
        Err(_) => ("other", "unknown".into()),
    }
}

enum Route {
    Metrics,
    Info(Value),
    Discovery(Value),
    Resource(Target),
}

/// A name or namespace from a path segment, percent-decoded: one object's
/// name (a DNS-1123 subdomain), so that `x%2F..%2Fvictim` addresses nothing.
fn object_name(what: &str, segment: &str) -> Result<String, ApiStatus> {
    let name = percent_decode_path(segment);
    if knit_api::validate::is_dns_subdomain(&name) {
        Ok(name)
    } else {
        Err(ApiStatus::bad_request(format!(
            "invalid {what} {name:?} in the request path: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

/// Percent-decoding of a path segment (`+` is itself there).
fn percent_decode_path(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

fn route(st: &AppState, path: &str) -> Result<Route, ApiStatus> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let nf = || {
        ApiStatus::not_found(format!(
            "the server could not find the requested resource ({path})"
        ))
    };
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Info(resources::version_doc())),
        ["metrics"] => return Ok(Route::Metrics),
        ["healthz" | "livez" | "readyz"] => return Ok(Route::Info(json!("ok"))),
        ["api"] => {
            return Ok(Route::Discovery(resources::api_versions(
                &st.server_address,
            )))
        }
        ["apis"] => return Ok(Route::Discovery(resources::api_group_list())),
        ["apis", g] => return resources::api_group(g).map(Route::Discovery).ok_or_else(nf),
        ["api", v] => {
            return resources::resource_list("", v)
                .map(Route::Discovery)
                .ok_or_else(nf)
        }
        ["apis", g, v] => {
            return resources::resource_list(g, v)
                .map(Route::Discovery)
                .ok_or_else(nf)
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(nf()),
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] => (Some(ns.to_string()), (*plural, tail)),
        [plural, tail @ ..] => (None, (*plural, tail)),
        [] => return Err(nf()),
    };
    let (plural, tail) = rest;
    let def = resources::find(group, version, plural).ok_or_else(nf)?;
    if ns.is_some() && !def.namespaced {
        return Err(nf());
    }
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(object_name("name", name)?), None),
        [name, sub] => {
            if !def.subresources.iter().any(|(s, _)| s == sub) {
                return Err(nf());
            }
            (Some(object_name("name", name)?), Some(sub.to_string()))
        }
        _ => return Err(nf()),
    };
    let ns = ns.map(|n| object_name("namespace", &n)).transpose()?;
    Ok(Route::Resource(Target { def, ns, name, sub }))
}

fn serve(
    st: &Arc<AppState>,
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    peer: &PeerIdentity,
    body: Bytes,
) -> Result<Response, ApiStatus> {
    let who = authenticate(st, headers, peer)?;
    let t = match route(st, path)? {
        Route::Info(v) => return Ok(json_response(StatusCode::OK, &v)),
        Route::Metrics => {
            if who.is_anonymous() {
                return Err(ApiStatus::unauthorized("Unauthorized"));
            }
            if !who.is_admin() {
                return Err(ApiStatus::forbidden(format!(
                    "forbidden: User \"{}\" cannot get path \"/metrics\"",
                    who.user
                )));
            }
            let text = st.metrics.text(st.store.current_rv());
            return Ok((
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                text,
            )
                .into_response());
        }
        Route::Discovery(v) => {
            if who.is_anonymous() {
                return Err(ApiStatus::unauthorized("Unauthorized"));
            }
            return Ok(json_response(StatusCode::OK, &v));
        }
        Route::Resource(t) => t,
    };
    let ctx = Ctx {
        st,
        who: &who,
        t: &t,
        query,
        headers,
    };
    match (method.as_str(), &t.name) {
        ("GET", None) if is_true(query.get("watch")) => ctx.watch(),
        ("GET", None) => ctx.list(),
        ("GET", Some(name)) => ctx.get(name),
        ("POST", None) => ctx.create(&body),
        ("POST", Some(name)) if t.sub.as_deref() == Some("eviction") => ctx.evict(name, &body),
        ("PUT", Some(name)) => ctx.update(name, &body),
        ("PATCH", Some(name)) => ctx.patch(name, &body),
        ("DELETE", Some(name)) => ctx.delete(name, &body),
        (m, _) => Err(ApiStatus::method_not_allowed(format!(
            "method {m} is not supported on {path}"
        ))),
    }
}

fn is_true(v: Option<&String>) -> bool {
    matches!(v.map(String::as_str), Some("true" | "1"))
}

struct Ctx<'a> {
    st: &'a Arc<AppState>,
    who: &'a Identity,
    t: &'a Target,
    query: &'a HashMap<String, String>,
    headers: &'a HeaderMap,
}

impl Ctx<'_> {
    fn ns(&self) -> &str {
        self.t.ns.as_deref().unwrap_or("")
    }

    fn authorize(&self, verb: Verb, name: Option<&str>) -> Result<Scope, ApiStatus> {
        if self.t.def.namespaced && self.t.ns.is_none() && !matches!(verb, Verb::List | Verb::Watch)
        {
            return Err(ApiStatus::not_found(format!(
                "{} must be addressed in a namespace",
                self.t.def.plural
            )));
        }
        if !self.t.def.verbs.contains(&verb.as_str()) {
            return Err(ApiStatus::method_not_allowed(format!(
                "{} does not support {}",
                self.t.def.plural,
                verb.as_str()
            )));
        }
        auth::authorize(
            self.who,
            &auth::Request {
                verb,
                def: self.t.def,
                namespace: self.t.ns.as_deref(),
                name,
                subresource: self.t.sub.as_deref(),
            },
        )
    }

    fn not_found(&self, name: &str) -> ApiStatus {
        let d = self.t.def;
        ApiStatus::not_found(format!(
            "{}{} \"{name}\" not found",
            d.plural,
            group_suffix(d)
        ))
        .with_details(json!({"name": name, "group": d.group, "kind": d.plural}))
    }

    fn wants_table(&self) -> bool {
        self.headers
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok())
            .is_some_and(|a| a.contains("as=Table"))
    }

    fn selector(&self) -> Result<Selector, ApiStatus> {
        Selector::parse(
            self.query.get("labelSelector").map(String::as_str),
            self.query.get("fieldSelector").map(String::as_str),
        )
    }

    fn get(&self, name: &str) -> Result<Response, ApiStatus> {
        let scope = self.authorize(Verb::Get, Some(name))?;
        let min = get_min_rv(self.query)?;
        let obj = self
            .st
            .store
            .get_served(self.t.def.plural, self.ns(), name, min)?
            .filter(|o| visible(&scope, o))
            .ok_or_else(|| self.not_found(name))?;
        if self.wants_table() {
            let rv = util::rv_of(&obj).unwrap_or(0);
            let include = Include::parse(self.query.get("includeObject").map(String::as_str));
            return Ok(json_response(
                StatusCode::OK,
                &table::table(self.t.def, &[(*obj).clone()], rv, include),
            ));
        }
        Ok(json_response(StatusCode::OK, &obj))
    }

    /// A list, paged with `limit` and `continue` as kube-apiserver pages
    /// it: selectors apply before the limit, every page of a run is read
    /// at the first page's resourceVersion (see `paging`).
    fn list(&self) -> Result<Response, ApiStatus> {
        let selector = self.selector()?;
        let scope = self.authorize(Verb::List, selector.pinned_name())?;
        let opts = paging::ListOptions::parse(self.query)?;
        let d = self.t.def;
        // Counted only when every object is served, as kube-apiserver
        // counts it only without selectors; then only a page (and one
        // more object) is read.
        let counted = selector.is_empty() && matches!(scope, Scope::All);
        let want = opts.limit.filter(|_| counted);
        let snap = match self.st.store.list_snapshot(
            d.plural,
            self.t.ns.as_deref(),
            d.namespaced,
            opts.at,
            &opts.start,
            want,
        ) {
            Ok(s) => s,
            Err(SnapshotError::Compacted) => {
                return Ok(json_response(StatusCode::GONE, &paging::expired(&opts)))
            }
            Err(SnapshotError::Future { current }) => {
                return Err(paging::too_large(opts.at.unwrap_or(current), current))
            }
            Err(SnapshotError::Api(e)) => return Err(e),
        };
        if let Some(min) = opts.not_older_than.filter(|min| *min > snap.rv) {
            return Err(paging::too_large(min, snap.rv));
        }
        let table = self.wants_table();
        // Every object served as stored: its JSON is copied, not parsed.
        let raw = counted && !table;
        let mut items: Vec<Listed<'_>> = Vec::new();
        let mut last_key = "";
        let mut next = None;
        for (key, body) in &snap.items {
            let item = match body {
                ListedBody::Stored(json) if raw => Listed::Json(json),
                _ => {
                    let obj = body.value()?;
                    if !(visible(&scope, &obj) && selector.matches(&obj)) {
                        continue;
                    }
                    Listed::Object(obj)
                }
            };
            if opts.limit.is_some_and(|l| items.len() >= l) {
                // One more object is served: there is a next page.
                next = Some((
                    paging::encode(snap.rv as i64, last_key),
                    counted.then_some(snap.total.saturating_sub(items.len())),
                ));
                break;
            }
            last_key = key;
            items.push(item);
        }
        let mut metadata = json!({"resourceVersion": snap.rv.to_string()});
        if let Some((token, remaining)) = next {
            metadata["continue"] = json!(token);
            if let Some(n) = remaining {
                metadata["remainingItemCount"] = json!(n);
            }
        }
        if table {
            let objects: Vec<Value> = items
                .into_iter()
                .map(|i| match i {
                    Listed::Object(o) => Ok(o),
                    Listed::Json(j) => serde_json::from_str(j)
                        .map_err(|e| ApiStatus::internal(format!("stored object: {e}"))),
                })
                .collect::<Result<_, _>>()?;
            let include = Include::parse(self.query.get("includeObject").map(String::as_str));
            let mut t = table::table(d, &objects, snap.rv, include);
            t["metadata"] = metadata;
            return Ok(json_response(StatusCode::OK, &t));
        }
        // The list written out around its items (no copy of them as values).
        let head = json!({
            "kind": format!("{}List", d.kind),
            "apiVersion": d.api_version(),
            "metadata": metadata,
        })
        .to_string();
        let size: usize = items
            .iter()
            .map(|i| match i {
                Listed::Json(j) => j.len() + 1,
                Listed::Object(_) => 1024,
            })
            .sum();
        let mut out = String::with_capacity(head.len() + size + 16);
        out.push_str(head.strip_suffix('}').unwrap_or(&head));
        out.push_str(",\"items\":[");
        for (n, item) in items.iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            match item {
                Listed::Json(j) => out.push_str(j),
                Listed::Object(o) => out.push_str(&o.to_string()),
            }
        }
        out.push_str("]}");
        Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            out,
        )
            .into_response())
    }

    fn parse_body(&self, body: &[u8]) -> Result<Value, ApiStatus> {
        let yaml = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|c| c.to_str().ok())
            .is_some_and(|c| c.contains("yaml"));
        let v: Value = if yaml {
            serde_yaml_ng::from_slice(body).map_err(|e| {
                ApiStatus::bad_request(format!("request body is not valid YAML: {e}"))
            })?
        } else {
            serde_json::from_slice(body).map_err(|e| {
                ApiStatus::bad_request(format!("request body is not valid JSON: {e}"))
            })?
        };
        if !v.is_object() {
            return Err(ApiStatus::bad_request("request body must be an object"));
        }
        let d = self.t.def;
        if let Some(k) = v["kind"].as_str() {
            if k != d.kind {
                return Err(ApiStatus::bad_request(format!(
                    "kind {k} does not match the resource {} ({})",
                    d.plural, d.kind
                )));
            }
        }
        if let Some(a) = v["apiVersion"].as_str() {
            if a != d.api_version() {
                return Err(ApiStatus::bad_request(format!(
                    "apiVersion {a} is not served here; use {}",
                    d.api_version()
                )));
            }
        }
        let body_ns = util::namespace_of(&v);
        if d.namespaced && !body_ns.is_empty() && body_ns != self.ns() {
            return Err(ApiStatus::bad_request(format!(
                "the namespace of the object ({body_ns}) does not match the namespace on the request ({})",
                self.ns()
            )));
        }
        Ok(v)
    }

    /// Kind, apiVersion and namespace as the server stores them.
    fn normalize(&self, obj: &mut Value) {
        let d = self.t.def;
        obj["kind"] = json!(d.kind);
        obj["apiVersion"] = json!(d.api_version());
        let meta = util::meta_mut(obj);
        if d.namespaced {
            meta.insert("namespace".into(), json!(self.ns()));
        } else {
            meta.remove("namespace");
        }
    }

    fn create(&self, body: &[u8]) -> Result<Response, ApiStatus> {
        if self.t.sub.is_some() {
            return Err(ApiStatus::method_not_allowed(
                "create is not supported on subresources",
            ));
        }
        let mut obj = self.parse_body(body)?;
        if util::name_of(&obj).is_empty() {
            if let Some(prefix) = obj["metadata"]["generateName"].as_str().map(str::to_string) {
                util::meta_mut(&mut obj).insert(
                    "name".into(),
                    json!(format!("{prefix}{}", util::random_alnum(5)?)),
                );
            }
        }
        self.normalize(&mut obj);
        let name = util::name_of(&obj).to_string();
        self.authorize(Verb::Create, Some(&name))?;
        if self.t.def.namespaced {
            let Some(ns) = self.st.store.get_seen("namespaces", "", self.ns())? else {
                return Err(ApiStatus::not_found(format!(
                    "namespaces \"{}\" not found",
                    self.ns()
                )));
            };
            if !ns["metadata"]["deletionTimestamp"].is_null() {
                return Err(ApiStatus::forbidden(format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
                    self.t.def.plural,
                    self.ns()
                )));
            }
        }
        admission::prepare_create(self.t.def, &mut obj, self.who);
        admission::validate(self.t.def, &obj)?;
        admission::node_restriction(self.who, self.t.def, None, &obj)?;
        let created = self.st.store.create(self.t.def.plural, self.ns(), obj)?;
        Ok(json_response(StatusCode::CREATED, &created))
    }

    /// Merge a write into the current object according to the subresource:
    /// the main resource never changes status; `status` changes only status;
    /// `approval` only the CSR's conditions.
    fn scoped(&self, current: &Value, mut next: Value) -> Value {
        let has_status = self.t.def.subresources.iter().any(|(s, _)| *s == "status");
        if self.t.sub.is_none() {
            admission::prepare_update(self.t.def, current, &mut next);
        }
        match self.t.sub.as_deref() {
            None if has_status => {
                match current.get("status") {
                    Some(s) => next["status"] = s.clone(),
                    None => {
                        if let Some(o) = next.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
                next
            }
            None => next,
            Some("approval") => {
                let mut out = current.clone();
                util::field_mut(&mut out, "status")
                    .insert("conditions".into(), next["status"]["conditions"].clone());
                out
            }
            Some(_) => {
                let mut out = current.clone();
                out["status"] = next["status"].take();
                out
            }
        }
    }

    fn update(&self, name: &str, body: &[u8]) -> Result<Response, ApiStatus> {
        let mut obj = self.parse_body(body)?;
        let body_name = util::name_of(&obj);
        if !body_name.is_empty() && body_name != name {
            return Err(ApiStatus::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let scope = self.authorize(Verb::Update, Some(name))?;
        self.normalize(&mut obj);
        util::meta_mut(&mut obj).insert("name".into(), json!(name));
        let expected =
            match obj["metadata"]["resourceVersion"].as_str() {
                None | Some("") => None,
                Some(s) => Some(s.parse::<u64>().map_err(|_| {
                    ApiStatus::bad_request(format!("invalid resourceVersion {s:?}"))
                })?),
            };
        if self.t.def.kind == "Secret" {
            admission::fold_string_data(&mut obj);
        }
        let def = self.t.def;
        let updated = self.guaranteed_update(name, expected, |current| {
            self.may_write(&scope, current)?;
            let next = self.scoped(current, obj.clone());
            admission::validate(def, &next)?;
            admission::node_restriction(self.who, def, Some(current), &next)?;
            Ok(next)
        })?;
        Ok(json_response(StatusCode::OK, &updated))
    }

    /// Read the object, compute its next state with no lock held, and
    /// write it if nothing changed it meanwhile; otherwise read again and
    /// recompute (kube-apiserver's GuaranteedUpdate). With `expected` (the
    /// client's resourceVersion) a changed object is a 409 for the client.
    fn guaranteed_update(
        &self,
        name: &str,
        expected: Option<u64>,
        compute: impl Fn(&Value) -> Result<Value, ApiStatus>,
    ) -> Result<Value, ApiStatus> {
        const ATTEMPTS: usize = 8;
        let plural = self.t.def.plural;
        let conflict = || {
            ApiStatus::conflict(format!(
                "Operation cannot be fulfilled on {plural} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ))
        };
        // First the object as this server has it in memory, at whatever
        // version it has seen (kube-apiserver starts from its watch
        // cache's copy too): the write is made only if the datastore still
        // holds that version. On PostgreSQL another server may have written
        // it since: on a conflict, or when memory lacks the object or holds
        // another version than the client's, read the newest and go on
        // from there. On SQLite memory is the datastore: the same read.
        let mut min = Some(0);
        for _ in 0..ATTEMPTS {
            let maybe_stale = min.is_some_and(|_| !self.st.store.serves_from_memory(None));
            let current = self.st.store.get_served(plural, self.ns(), name, min)?;
            let current = match current {
                Some(c) if expected.is_none_or(|e| util::rv_of(&c) == Some(e)) => c,
                _ if maybe_stale => {
                    min = None;
                    continue;
                }
                None => return Err(self.not_found(name)),
                Some(_) => return Err(conflict()),
            };
            let next = compute(&current)?;
            match self
                .st
                .store
                .replace(plural, self.ns(), name, &current, next)
            {
                Err(e) if e.code == 409 && expected.is_none() => min = None,
                Err(e) if e.code == 404 && maybe_stale => min = None,
                Err(e) if e.code == 404 => return Err(self.not_found(name)),
                other => return other,
            }
        }
        Err(conflict())
    }

    fn patch(&self, name: &str, body: &[u8]) -> Result<Response, ApiStatus> {
        let scope = self.authorize(Verb::Patch, Some(name))?;
        let ctype = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|c| c.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let p: Value = serde_json::from_slice(body)
            .map_err(|e| ApiStatus::bad_request(format!("patch is not valid JSON: {e}")))?;
        let expected =
            match p["metadata"]["resourceVersion"].as_str() {
                Some(s) if !s.is_empty() => Some(s.parse::<u64>().map_err(|_| {
                    ApiStatus::bad_request(format!("invalid resourceVersion {s:?}"))
                })?),
                _ => None,
            };
        let def = self.t.def;
        if !matches!(
            ctype.as_str(),
            "application/merge-patch+json"
                | "application/strategic-merge-patch+json"
                | "application/json-patch+json"
        ) {
            return Err(ApiStatus::unsupported_media(format!(
                "the body of the request was in an unknown format ({ctype:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
            )));
        }
        let updated = self.guaranteed_update(name, expected, |current| {
            self.may_write(&scope, current)?;
            let mut next = current.clone();
            match ctype.as_str() {
                "application/merge-patch+json" => patch::merge_patch(&mut next, &p),
                "application/strategic-merge-patch+json" => {
                    patch::strategic_merge_patch(&mut next, &p)?
                }
                _ => patch::json_patch(&mut next, &p, MAX_OBJECT_BYTES)?,
            }
            if !next.is_object() {
                return Err(ApiStatus::bad_request("patch must leave an object"));
            }
            if def.kind == "Secret" {
                admission::fold_string_data(&mut next);
            }
            let next = self.scoped(current, next);
            admission::validate(def, &next)?;
            admission::node_restriction(self.who, def, Some(current), &next)?;
            Ok(next)
        })?;
        Ok(json_response(StatusCode::OK, &updated))
    }

    /// A write to an object the caller may only touch when it is its own:
    /// a node and the pods bound to it (NodeRestriction's 403).
    fn may_write(&self, scope: &Scope, current: &Value) -> Result<(), ApiStatus> {
        match scope {
            Scope::BoundPods(node) if !visible(scope, current) => Err(ApiStatus::forbidden(format!(
                "pods \"{}\" is forbidden: node \"{node}\" can only update or delete pods with spec.nodeName set to itself",
                util::name_of(current)
            ))),
            _ => Ok(()),
        }
    }

    fn delete(&self, name: &str, body: &[u8]) -> Result<Response, ApiStatus> {
        if self.t.sub.is_some() {
            return Err(ApiStatus::method_not_allowed(
                "delete is not supported on subresources",
            ));
        }
        let scope = self.authorize(Verb::Delete, Some(name))?;
        let opts = pods::DeleteOptions::parse(self.query, body)?;
        let plural = self.t.def.plural;
        if plural == pods::PODS {
            let gone = pods::delete(&self.st.store, self.ns(), name, &opts, &|current| {
                self.may_write(&scope, current)
            })?;
            return Ok(json_response(StatusCode::OK, &gone));
        }
        if plural == "namespaces" {
            return self.delete_namespace(name, &opts);
        }
        let mut expected = None;
        if opts.uid.is_some() || opts.resource_version.is_some() {
            let current = self
                .st
                .store
                .get(plural, self.ns(), name)?
                .ok_or_else(|| self.not_found(name))?;
            opts.check(plural, &current)?;
            expected = util::rv_of(&current);
        }
        if opts.dry_run {
            let current = self
                .st
                .store
                .get(plural, self.ns(), name)?
                .ok_or_else(|| self.not_found(name))?;
            return Ok(json_response(StatusCode::OK, &current));
        }
        let gone = self
            .st
            .store
            .delete_if(plural, self.ns(), name, expected)
            .map_err(|e| {
                if e.code == 404 {
                    self.not_found(name)
                } else {
                    e
                }
            })?;
        Ok(json_response(StatusCode::OK, &gone))
    }

    /// A namespace is deleted as kube-apiserver and the namespace
    /// controller do it: marked `Terminating` (with `deletionTimestamp`)
    /// here, emptied and removed by the controller. The built-in ones stay.
    fn delete_namespace(
        &self,
        name: &str,
        opts: &pods::DeleteOptions,
    ) -> Result<Response, ApiStatus> {
        if resources::NAMESPACES.contains(&name) {
            return Err(ApiStatus::forbidden(format!(
                "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
            )));
        }
        let now = util::now_rfc3339();
        let marked = self.guaranteed_update(name, None, |current| {
            opts.check("namespaces", current)?;
            let mut next = current.clone();
            if next["metadata"]["deletionTimestamp"].is_null() {
                util::meta_mut(&mut next).insert("deletionTimestamp".into(), json!(now));
                util::meta_mut(&mut next).insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            util::field_mut(&mut next, "status").insert("phase".into(), json!("Terminating"));
            Ok(next)
        })?;
        Ok(json_response(StatusCode::OK, &marked))
    }

    /// POST `pods/<name>/eviction` (policy/v1 or v1beta1 Eviction).
    fn evict(&self, name: &str, body: &[u8]) -> Result<Response, ApiStatus> {
        self.authorize(Verb::Create, Some(name))?;
        let mut eviction: Value = serde_json::from_slice(body)
            .map_err(|e| ApiStatus::bad_request(format!("request body is not valid JSON: {e}")))?;
        if !eviction.is_object() {
            return Err(ApiStatus::bad_request("request body must be an object"));
        }
        let body_ns = util::namespace_of(&eviction);
        if !body_ns.is_empty() && body_ns != self.ns() {
            return Err(ApiStatus::bad_request(format!(
                "the namespace of the object ({body_ns}) does not match the namespace on the request ({})",
                self.ns()
            )));
        }
        util::meta_mut(&mut eviction);
        if self.query.get("dryRun").is_some_and(|d| d == "All") {
            // CreateOptions.dryRun carried into the eviction's delete
            // options, as kube-apiserver's propagateDryRun does.
            util::field_mut(&mut eviction, "deleteOptions").insert("dryRun".into(), json!(["All"]));
        }
        let (code, status) = pods::evict(&self.st.store, self.ns(), name, &eviction)?;
        let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Ok(json_response(code, &status))
    }

    fn watch(&self) -> Result<Response, ApiStatus> {
        let selector = self.selector()?;
        let scope = self.authorize(Verb::Watch, selector.pinned_name())?;
        let from =
            match self.query.get("resourceVersion").map(String::as_str) {
                None | Some("") | Some("0") => None,
                Some(s) => Some(s.parse::<u64>().map_err(|_| {
                    ApiStatus::bad_request(format!("invalid resourceVersion {s:?}"))
                })?),
            };
        let timeout = self
            .query
            .get("timeoutSeconds")
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|s| *s > 0)
            .unwrap_or(1800);
        let bookmarks = is_true(self.query.get("allowWatchBookmarks"));
        let def = self.t.def;
        let ns = self.t.ns.clone();
        let start = self.st.store.watch(def.plural, ns.as_deref(), from)?;
        let interval = self.st.bookmark_interval;
        let store = self.st.store.clone();
        let mut shutdown = self.st.shutdown.clone();
        let open = self.st.metrics.watch();
        // `kubectl get -w` asks for Table events: one row per event, the
        // column definitions only in the first, as kube-apiserver sends them.
        let mut table = self.wants_table().then(|| {
            (
                Include::parse(self.query.get("includeObject").map(String::as_str)),
                true,
            )
        });
        let (tx, rx) = mpsc::channel::<Bytes>(256);
        tokio::spawn(async move {
            let _open = open;
            let mut send_change = |c: &Change| {
                if c.resource != def.plural || ns.as_deref().is_some_and(|n| n != c.namespace) {
                    return None;
                }
                let seen = |o: &Value| visible(&scope, o) && selector.matches(o);
                let now = seen(&c.object);
                let kind = match (c.kind, c.previous.as_deref().map(seen)) {
                    (EventType::Modified, Some(false)) if now => EventType::Added,
                    (EventType::Modified, Some(true)) if !now => EventType::Deleted,
                    (k, _) if now => k,
                    _ => return None,
                };
                let object = match &mut table {
                    Some((include, first)) => {
                        let mut t =
                            table::table(def, std::slice::from_ref(&*c.object), c.rv, *include);
                        if !std::mem::replace(first, false) {
                            t["columnDefinitions"] = json!([]);
                        }
                        t
                    }
                    None => (*c.object).clone(),
                };
                Some(line(&json!({"type": kind.as_str(), "object": object})))
            };
            let mut progress = start.rv;
            for c in &start.initial {
                if let Some(l) = send_change(c) {
                    if tx.send(l).await.is_err() {
                        return;
                    }
                }
            }
            let mut feed = start.feed;
            let deadline = tokio::time::sleep(Duration::from_secs(timeout));
            tokio::pin!(deadline);
            let mut tick = tokio::time::interval(interval);
            tick.tick().await;
            loop {
                let out = tokio::select! {
                    _ = &mut deadline => break,
                    _ = shutdown.changed() => break,
                    _ = tick.tick(), if bookmarks => {
                        // The feed carries this resource's changes only: the
                        // bookmark may name the cluster's newest version
                        // once every change up to it has been sent (they are
                        // in the feed before that version is current).
                        let newest = store.current_rv();
                        let mut ended = false;
                        loop {
                            match feed.try_recv() {
                                Ok(c) => {
                                    progress = c.rv;
                                    if let Some(l) = send_change(&c) {
                                        if tx.send(l).await.is_err() {
                                            ended = true;
                                            break;
                                        }
                                    }
                                }
                                Err(broadcast::error::TryRecvError::Empty) => {
                                    progress = progress.max(newest);
                                    break;
                                }
                                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                                    let status = ApiStatus::gone("watch fell behind; list again");
                                    let _ = tx.send(line(&json!({"type": "ERROR", "object": status.body()}))).await;
                                    ended = true;
                                    break;
                                }
                                Err(broadcast::error::TryRecvError::Closed) => {
                                    ended = true;
                                    break;
                                }
                            }
                        }
                        if ended {
                            break;
                        }
                        Some(line(&json!({
                            "type": "BOOKMARK",
                            "object": {"kind": def.kind, "apiVersion": def.api_version(),
                                       "metadata": {"resourceVersion": progress.to_string()}},
                        })))
                    }
                    r = feed.recv() => match r {
                        Ok(c) => {
                            progress = c.rv;
                            send_change(&c)
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            // Too slow a reader: end with 410 so it relists.
                            let status = ApiStatus::gone("watch fell behind; list again");
                            let _ = tx.send(line(&json!({"type": "ERROR", "object": status.body()}))).await;
                            break;
                        }
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                };
                if let Some(l) = out {
                    if tx.send(l).await.is_err() {
                        break;
                    }
                }
            }
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
        });
        Ok(Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CACHE_CONTROL, "no-cache, private")
            .body(Body::from_stream(stream))
            .unwrap_or_else(|e| ApiStatus::internal(e.to_string()).into_response()))
    }
}

/// An object of a list page: its stored JSON, or parsed (it was filtered).
enum Listed<'a> {
    Json(&'a str),
    Object(Value),
}

fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

fn group_suffix(d: &ResourceDef) -> String {
    if d.group.is_empty() {
        String::new()
    } else {
        format!(".{}", d.group)
    }
}

fn visible(scope: &Scope, obj: &Value) -> bool {
    match scope {
        Scope::All => true,
        Scope::Named(n) => util::name_of(obj) == n,
        Scope::OwnCsrs(user) => obj["spec"]["username"].as_str() == Some(user),
        Scope::BoundPods(node) => obj["spec"]["nodeName"].as_str() == Some(node),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = url_decode_pairs(
            "labelSelector=a%3Db%2Cc&fieldSelector=metadata.name%3Dn1&watch=1&x=%zz",
        );
        assert_eq!(q["labelSelector"], "a=b,c");
        assert_eq!(q["fieldSelector"], "metadata.name=n1");
        assert_eq!(q["x"], "%zz");
        let q = url_decode_pairs("a=1+2&b&a=%E2%9C%93&c=%4");
        assert_eq!(
            (q["a"].as_str(), q["b"].as_str(), q["c"].as_str()),
            ("✓", "", "%4")
        );
        assert_eq!(percent_decode_path("x%2F..%2Fv+w%zz"), "x/../v+w%zz");
    }
}
