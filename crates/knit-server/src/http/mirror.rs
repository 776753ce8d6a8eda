//! `GET /mirror/*path` (public): the package mirror's files. Only plain
//! relative paths inside the mirror are served; a `.` component is
//! dropped (apt asks a flat repository for `debian/./Release`).
//!
//! Answered the way a Debian mirror's web server answers apt: every file
//! with `Content-Length` and `Last-Modified`, `If-Modified-Since` answered
//! `304` (apt's second `update` fetches nothing), the connection kept
//! alive. A missing file is a `404` with an empty body and no
//! `Content-Type`: apt then fails the item at once and keeps the
//! connection, instead of reading an error page into `/dev/null` (which
//! stalled every node's `apt-get update` for its whole timeout where that
//! device was not writable).

use super::Cp;
use crate::error::{Result, ServerError};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::time::UNIX_EPOCH;

/// A 404 with no body: nothing for apt to read and discard.
fn not_found(path: &str) -> Response {
    let mut r = StatusCode::NOT_FOUND.into_response();
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    if let Ok(v) = HeaderValue::from_str(&format!("mirror file {path} not found")) {
        r.headers_mut().insert("x-knit-error", v);
    }
    r
}

pub async fn mirror_file(
    State(cp): State<Cp>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    // Only plain relative components: nothing outside the mirror is served.
    let parts: Vec<&str> = path.split('/').filter(|c| *c != ".").collect();
    let clean = !parts.is_empty()
        && parts
            .iter()
            .all(|c| !c.is_empty() && *c != ".." && !c.contains('\\'));
    if !clean {
        return Ok(not_found(&path));
    }
    let full = cp.mirror_dir.join(parts.join("/"));
    let file = match tokio::fs::File::open(&full).await {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(not_found(&path))
        }
        Err(e) => return Err(ServerError::io(format!("open {}", full.display()), e)),
    };
    let meta = file
        .metadata()
        .await
        .map_err(|e| ServerError::io(format!("stat {}", full.display()), e))?;
    if !meta.is_file() {
        return Ok(not_found(&path));
    }
    // Whole seconds: HTTP dates have no finer unit.
    let modified = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs());
    let last_modified = modified.map(http_date);
    let since = headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_http_date);
    if let (Some(m), Some(since)) = (modified, since) {
        if m <= since {
            let mut r = StatusCode::NOT_MODIFIED.into_response();
            if let Some(lm) = last_modified.and_then(|v| HeaderValue::from_str(&v).ok()) {
                r.headers_mut().insert(header::LAST_MODIFIED, lm);
            }
            return Ok(r);
        }
    }
    let body = super::file_body(file);
    let mut r = (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, meta.len().to_string()),
        ],
        body,
    )
        .into_response();
    if let Some(lm) = last_modified.and_then(|v| HeaderValue::from_str(&v).ok()) {
        r.headers_mut().insert(header::LAST_MODIFIED, lm);
    }
    Ok(r)
}

/// Seconds since the epoch as an HTTP date (`Wed, 02 Dec 2026 08:12:09 GMT`).
pub use knit_os::time::http_date;

/// An HTTP date as seconds since the epoch; anything else is `None` (the
/// file is then sent whole).
pub fn parse_http_date(text: &str) -> Option<u64> {
    knit_os::time::parse_http_date(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_round_trip() {
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        for secs in [0, 68_169_599, 951_782_400, 1_796_199_129, 4_102_444_800] {
            assert_eq!(parse_http_date(&http_date(secs)), Some(secs), "{secs}");
        }
        assert_eq!(parse_http_date("Wed, 02 Dec 2026 08:12:09 UTC"), None);
        assert_eq!(parse_http_date("yesterday"), None);
    }
}
