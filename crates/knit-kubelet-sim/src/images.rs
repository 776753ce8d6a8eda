//! System images: after start, every image of the package's image list
//! (`images.txt`, one reference a line) is ensured through CRI
//! `ImageService`, as kubelet does for a pod's images: `ImageStatus`, and
//! `PullImage` only when the runtime does not have it. Log lines follow
//! kubelet's events: `Successfully pulled image "<ref>" …` only after a
//! real pull, `Container image "<ref>" already present on machine` for a
//! cached one — so `grep "pulled image"` counts real pulls (docs/spec.md §3.3).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{ImageSpec, ImageStatusRequest, PullImageRequest};
use serde::Serialize;

use crate::cri::{chain, channel};
use crate::error::SimError;

/// A pull of a large image over a slow link takes minutes.
const PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);
const PULL_ATTEMPTS: u32 = 5;

/// The node annotation that carries the summary to the control plane.
pub const ANNOTATION: &str = "knit.dev/image-cache";
/// Beside the kubelet's state, for the node's own tools and tests.
pub const REPORT_FILE: &str = "knit-images.json";

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageOutcome {
    pub image: String,
    /// The runtime already had it: no pull.
    pub cached: bool,
    /// Size the runtime reports for the image (its content in the store).
    pub size_bytes: u64,
    /// Bytes fetched for it: its size when pulled, 0 when cached.
    pub bytes_pulled: u64,
    pub repo_digests: Vec<String>,
    pub pull_millis: u64,
    /// Why it is not present, after every attempt failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ImageReport {
    pub images: Vec<ImageOutcome>,
    pub hit: usize,
    pub miss: usize,
    pub failed: usize,
    pub bytes_pulled: u64,
    /// From start of the first check to the last image present.
    pub total_millis: u64,
}

impl ImageReport {
    /// `hit=N miss=M bytes=B` (+ ` failed=F` when some are missing).
    pub fn annotation(&self) -> String {
        let mut s = format!(
            "hit={} miss={} bytes={}",
            self.hit, self.miss, self.bytes_pulled
        );
        if self.failed > 0 {
            s.push_str(&format!(" failed={}", self.failed));
        }
        s
    }

    /// `status.images` entries, as kubelet reports them.
    pub fn node_images(&self) -> serde_json::Value {
        let list: Vec<serde_json::Value> = self
            .images
            .iter()
            .filter(|i| i.error.is_none())
            .map(|i| {
                let mut names = i.repo_digests.clone();
                names.push(i.image.clone());
                serde_json::json!({"names": names, "sizeBytes": i.size_bytes})
            })
            .collect();
        serde_json::Value::Array(list)
    }
}

/// References from an image list: blank lines and `#` comments skipped.
pub fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The image list at `path`; `None` when there is none (nothing to ensure).
pub fn read_list(path: &Path) -> Result<Option<Vec<String>>, SimError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(parse_list(&text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SimError::io(path, e)),
    }
}

fn spec(image: &str) -> Option<ImageSpec> {
    Some(ImageSpec {
        image: image.to_string(),
        ..ImageSpec::default()
    })
}

type Client = ImageServiceClient<tonic::transport::Channel>;

async fn client(socket: &Path, timeout: Duration) -> Result<Client, String> {
    channel(socket, timeout)
        .await
        .map(ImageServiceClient::new)
        .map_err(|e| format!("dial unix {}: {}", socket.display(), chain(&e)))
}

/// `Some(image)` when the runtime has it.
async fn status(socket: &Path, image: &str) -> Result<Option<k8s_cri::v1::Image>, String> {
    let mut c = client(socket, STATUS_TIMEOUT).await?;
    c.image_status(ImageStatusRequest {
        image: spec(image),
        verbose: false,
    })
    .await
    .map(|r| r.into_inner().image)
    .map_err(|e| format!("rpc error: code = {:?} desc = {}", e.code(), e.message()))
}

async fn pull(socket: &Path, image: &str) -> Result<String, String> {
    let mut c = client(socket, PULL_TIMEOUT).await?;
    c.pull_image(PullImageRequest {
        image: spec(image),
        auth: None,
        sandbox_config: None,
    })
    .await
    .map(|r| r.into_inner().image_ref)
    .map_err(|e| format!("rpc error: code = {:?} desc = {}", e.code(), e.message()))
}

async fn ensure_one(socket: &Path, image: &str) -> ImageOutcome {
    let mut out = ImageOutcome {
        image: image.to_string(),
        cached: false,
        size_bytes: 0,
        bytes_pulled: 0,
        repo_digests: Vec::new(),
        pull_millis: 0,
        error: None,
    };
    let mut backoff = Duration::from_secs(2);
    for attempt in 1..=PULL_ATTEMPTS {
        let last = attempt == PULL_ATTEMPTS;
        match status(socket, image).await {
            Ok(Some(found)) => {
                tracing::info!(
                    image,
                    "Container image {image:?} already present on machine"
                );
                out.cached = true;
                out.size_bytes = found.size;
                out.repo_digests = found.repo_digests;
                return out;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(image, attempt, error = %e, "image status failed");
                if last {
                    out.error = Some(e);
                    return out;
                }
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                continue;
            }
        }
        tracing::info!(image, "Pulling image {image:?}");
        let start = Instant::now();
        match pull(socket, image).await {
            Ok(image_ref) => {
                let millis = start.elapsed().as_millis() as u64;
                let found = status(socket, image).await.ok().flatten();
                let size = found.as_ref().map_or(0, |f| f.size);
                out.size_bytes = size;
                out.bytes_pulled = size;
                out.pull_millis = millis;
                out.repo_digests = found.map(|f| f.repo_digests).unwrap_or_default();
                // kubelet's event wording; the one line docs/spec.md §3.3's check greps.
                tracing::info!(
                    image,
                    image_ref,
                    bytes = size,
                    "Successfully pulled image {image:?} in {:.3}s. Image size: {size} bytes.",
                    millis as f64 / 1000.0
                );
                return out;
            }
            Err(e) => {
                tracing::warn!(image, attempt, error = %e, "Failed to pull image {image:?}: {e}");
                // A reference the registry does not have will not appear.
                if last || e.contains("not found") {
                    out.error = Some(e);
                    return out;
                }
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
        }
    }
    out
}

/// Ensures every image in turn (kubelet's serialized pulls); never fails:
/// problems are in the report.
pub fn ensure(socket: &Path, images: &[String]) -> ImageReport {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return ImageReport {
                failed: images.len(),
                images: images
                    .iter()
                    .map(|i| ImageOutcome {
                        image: i.clone(),
                        cached: false,
                        size_bytes: 0,
                        bytes_pulled: 0,
                        repo_digests: Vec::new(),
                        pull_millis: 0,
                        error: Some(format!("tokio runtime: {e}")),
                    })
                    .collect(),
                ..ImageReport::default()
            }
        }
    };
    let start = Instant::now();
    let mut report = ImageReport::default();
    for image in images {
        let o = rt.block_on(ensure_one(socket, image));
        if o.error.is_some() {
            report.failed += 1;
        } else if o.cached {
            report.hit += 1;
        } else {
            report.miss += 1;
        }
        report.bytes_pulled += o.bytes_pulled;
        report.images.push(o);
    }
    report.total_millis = start.elapsed().as_millis() as u64;
    tracing::info!(
        hit = report.hit,
        miss = report.miss,
        failed = report.failed,
        bytes_pulled = report.bytes_pulled,
        millis = report.total_millis,
        "system images ensured"
    );
    report
}

/// Writes the report beside the kubelet's state (whole, world-readable).
pub fn write_report(root_dir: &Path, report: &ImageReport) -> Result<PathBuf, SimError> {
    let path = root_dir.join(REPORT_FILE);
    let body = serde_json::to_vec_pretty(report).map_err(|e| SimError::Config {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    crate::files::write_durable(&path, &body, 0o644)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_parsing_and_summary() {
        assert_eq!(
            parse_list("# system images\n\nregistry.k8s.io/pause:3.10\n  docker.io/x/y:1 \n"),
            vec!["registry.k8s.io/pause:3.10", "docker.io/x/y:1"]
        );
        let r = ImageReport {
            hit: 2,
            miss: 1,
            failed: 0,
            bytes_pulled: 42,
            ..ImageReport::default()
        };
        assert_eq!(r.annotation(), "hit=2 miss=1 bytes=42");
        let r = ImageReport { failed: 1, ..r };
        assert_eq!(r.annotation(), "hit=2 miss=1 bytes=42 failed=1");
    }

    #[test]
    fn an_unreachable_runtime_fails_every_image_in_the_report() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt
            .block_on(status(&dir.path().join("none.sock"), "x:1"))
            .unwrap_err();
        assert!(err.contains("none.sock"), "{err}");
        assert_eq!(read_list(&dir.path().join("absent")).unwrap(), None);
    }
}
