//! `GET /mirror/*path` (public): the package mirror's files. Only plain
//! relative paths inside the mirror are served; a `.` component is
//! dropped (apt asks a flat repository for `debian/./Release`).

use super::Cp;
use crate::error::{Result, ServerError};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

pub async fn mirror_file(State(cp): State<Cp>, Path(path): Path<String>) -> Result<Response> {
    // Only plain relative components: nothing outside the mirror is served.
    let parts: Vec<&str> = path.split('/').filter(|c| *c != ".").collect();
    let clean = !parts.is_empty()
        && parts
            .iter()
            .all(|c| !c.is_empty() && *c != ".." && !c.contains('\\'));
    let not_found = || ServerError::NotFound {
        kind: "mirror file",
        name: path.clone(),
    };
    if !clean {
        return Err(not_found());
    }
    let full = cp.mirror_dir.join(parts.join("/"));
    let file = match tokio::fs::File::open(&full).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => return Err(ServerError::io(format!("open {}", full.display()), e)),
    };
    let meta = file
        .metadata()
        .await
        .map_err(|e| ServerError::io(format!("stat {}", full.display()), e))?;
    if !meta.is_file() {
        return Err(not_found());
    }
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, meta.len().to_string()),
        ],
        body,
    )
        .into_response())
}
