//! `GET|HEAD /v2/…` (public, read-only): the control plane's registry, the
//! OCI distribution API's pull side over `crate::registry`'s layout:
//!
//! - `/v2/`: 200 (the API version check);
//! - `/v2/<name>/manifests/<tag|digest>`: the manifest, with its media
//!   type, `Docker-Content-Digest` and `Content-Length` (a `HEAD` is how
//!   containerd resolves a tag);
//! - `/v2/<name>/blobs/<digest>`: a config or layer;
//! - `/v2/<name>/tags/list`.
//!
//! `?ns=<host>` (containerd asks a mirror with the registry it mirrors)
//! picks that registry's images; without it any host's repository of that
//! name answers. Errors are the distribution API's JSON (`MANIFEST_UNKNOWN`,
//! `BLOB_UNKNOWN`, `NAME_UNKNOWN`), 404, so that containerd tries its next
//! host. Other methods are 405: nothing can be pushed.

use super::Cp;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use knit_registry::oci::{Layout, MAX_MANIFEST_BYTES};

const API_VERSION: (&str, &str) = ("docker-distribution-api-version", "registry/2.0");

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({"errors": [{"code": code, "message": message, "detail": null}]});
    let mut r = (status, axum::Json(body)).into_response();
    r.headers_mut()
        .insert(API_VERSION.0, HeaderValue::from_static(API_VERSION.1));
    r
}

/// `GET /v2/`.
pub async fn base() -> Response {
    let mut r = axum::Json(serde_json::json!({})).into_response();
    r.headers_mut()
        .insert(API_VERSION.0, HeaderValue::from_static(API_VERSION.1));
    r
}

/// What a path under `/v2/` asks for.
#[derive(Debug, PartialEq, Eq)]
enum Ask<'a> {
    Manifest { repo: &'a str, reference: &'a str },
    Blob { repo: &'a str, digest: &'a str },
    Tags { repo: &'a str },
}

fn parse(path: &str) -> Option<Ask<'_>> {
    if let Some(repo) = path.strip_suffix("/tags/list") {
        return Some(Ask::Tags { repo });
    }
    if let Some((repo, reference)) = path.rsplit_once("/manifests/") {
        return (!reference.contains('/')).then_some(Ask::Manifest { repo, reference });
    }
    if let Some((repo, digest)) = path.rsplit_once("/blobs/") {
        return (!digest.contains('/')).then_some(Ask::Blob { repo, digest });
    }
    None
}

/// The `ns` query parameter, when given.
fn namespace(query: Option<&str>) -> Option<String> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query?).ok()?;
    pairs.into_iter().find(|(k, _)| k == "ns").map(|(_, v)| v)
}

async fn file_response(path: std::path::PathBuf, media_type: &str, digest: &str) -> Response {
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(_) => {
            return error(
                StatusCode::NOT_FOUND,
                "BLOB_UNKNOWN",
                "blob unknown to registry",
            )
        }
    };
    let len = match file.metadata().await {
        Ok(m) => m.len(),
        Err(_) => {
            return error(
                StatusCode::NOT_FOUND,
                "BLOB_UNKNOWN",
                "blob unknown to registry",
            )
        }
    };
    let mut r = super::file_body(file).into_response();
    let h = r.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE.as_str(), media_type),
        (header::CONTENT_LENGTH.as_str(), &len.to_string()),
        ("docker-content-digest", digest),
        (header::ETAG.as_str(), &format!("\"{digest}\"")),
        API_VERSION,
    ] {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    }
    r
}

/// `GET|HEAD /v2/*path`.
pub async fn serve(
    State(cp): State<Cp>,
    Path(path): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(ask) = parse(&path) else {
        return error(
            StatusCode::NOT_FOUND,
            "NAME_UNKNOWN",
            "unknown registry path",
        );
    };
    let ns = namespace(query.as_deref());
    let state = cp.settings.state_dir.clone();
    let layout =
        match tokio::task::spawn_blocking(move || crate::registry::ensure_layout(&state)).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                tracing::warn!(code = e.code(), error = %e, "the system images cannot be served");
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "UNAVAILABLE",
                    &e.to_string(),
                );
            }
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN", &e.to_string()),
        };
    answer(&layout, ns.as_deref(), ask).await
}

async fn answer(layout: &Layout, ns: Option<&str>, ask: Ask<'_>) -> Response {
    match ask {
        Ask::Tags { repo } => {
            let tags: Vec<&str> = layout
                .entries
                .iter()
                .filter(|e| e.reference.repo == repo && ns.is_none_or(|h| h == e.reference.host))
                .map(|e| e.reference.tag.as_str())
                .collect();
            if tags.is_empty() {
                return error(
                    StatusCode::NOT_FOUND,
                    "NAME_UNKNOWN",
                    "repository name not known to registry",
                );
            }
            let mut r = axum::Json(serde_json::json!({"name": repo, "tags": tags})).into_response();
            r.headers_mut()
                .insert(API_VERSION.0, HeaderValue::from_static(API_VERSION.1));
            r
        }
        Ask::Manifest { repo, reference } => {
            let Some(entry) = layout.manifest(ns, repo, reference) else {
                let (code, message) = if layout.has_repository(ns, repo) {
                    ("MANIFEST_UNKNOWN", "manifest unknown")
                } else {
                    ("NAME_UNKNOWN", "repository name not known to registry")
                };
                return error(StatusCode::NOT_FOUND, code, message);
            };
            match layout.blob_path(&entry.digest) {
                Some(p) if entry.size <= MAX_MANIFEST_BYTES => {
                    file_response(p, &entry.media_type, &entry.digest).await
                }
                _ => error(
                    StatusCode::NOT_FOUND,
                    "MANIFEST_UNKNOWN",
                    "manifest unknown",
                ),
            }
        }
        Ask::Blob { repo, digest } => {
            if !layout.has_repository(ns, repo) {
                return error(
                    StatusCode::NOT_FOUND,
                    "NAME_UNKNOWN",
                    "repository name not known to registry",
                );
            }
            match layout.blob_path(digest) {
                Some(p) => file_response(p, "application/octet-stream", digest).await,
                None => error(
                    StatusCode::NOT_FOUND,
                    "BLOB_UNKNOWN",
                    "blob unknown to registry",
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_as_the_distribution_api_names_them() {
        assert_eq!(
            parse("flannel/flannel/manifests/v0.26.1"),
            Some(Ask::Manifest {
                repo: "flannel/flannel",
                reference: "v0.26.1"
            })
        );
        assert_eq!(
            parse("pause/blobs/sha256:00"),
            Some(Ask::Blob {
                repo: "pause",
                digest: "sha256:00"
            })
        );
        assert_eq!(parse("pause/tags/list"), Some(Ask::Tags { repo: "pause" }));
        assert_eq!(parse("pause/manifests/a/b"), None);
        assert_eq!(parse("pause"), None);
        assert_eq!(
            namespace(Some("ns=registry.k8s.io")).as_deref(),
            Some("registry.k8s.io")
        );
        assert_eq!(namespace(Some("x=1")), None);
        assert_eq!(namespace(None), None);
    }
}
