//! Request and watch metrics of the embedded API, in the Prometheus text
//! format (served at `/metrics` to admins, and available to the control
//! plane through `EmbeddedCluster::metrics_text`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// (verb, resource, HTTP code) of a request.
type Labels = (&'static str, String, u16);

#[derive(Default)]
pub struct Metrics {
    /// labels → (count, total seconds)
    requests: Mutex<BTreeMap<Labels, (u64, f64)>>,
    watches: AtomicI64,
}

/// Counts an open watch for as long as it lives.
pub struct WatchGuard(Arc<Metrics>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.watches.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    pub fn record(&self, verb: &'static str, resource: String, code: u16, took: Duration) {
        if let Ok(mut m) = self.requests.lock() {
            let e = m.entry((verb, resource, code)).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += took.as_secs_f64();
        }
    }

    pub fn watch(self: &Arc<Self>) -> WatchGuard {
        self.watches.fetch_add(1, Ordering::Relaxed);
        WatchGuard(self.clone())
    }

    pub fn text(&self, resource_version: u64) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP knit_cluster_requests_total API requests by verb, resource and HTTP code."
        );
        let _ = writeln!(out, "# TYPE knit_cluster_requests_total counter");
        let snapshot: Vec<_> = self
            .requests
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default();
        for ((verb, resource, code), (n, _)) in &snapshot {
            let _ = writeln!(
                out,
                "knit_cluster_requests_total{{verb=\"{verb}\",resource=\"{resource}\",code=\"{code}\"}} {n}"
            );
        }
        let _ = writeln!(out, "# HELP knit_cluster_request_seconds_total Time spent answering API requests (watches: until the stream is set up).");
        let _ = writeln!(out, "# TYPE knit_cluster_request_seconds_total counter");
        for ((verb, resource, code), (_, secs)) in &snapshot {
            let _ = writeln!(
                out,
                "knit_cluster_request_seconds_total{{verb=\"{verb}\",resource=\"{resource}\",code=\"{code}\"}} {secs:.6}"
            );
        }
        let _ = writeln!(out, "# HELP knit_cluster_watches Open watch streams.");
        let _ = writeln!(out, "# TYPE knit_cluster_watches gauge");
        let _ = writeln!(
            out,
            "knit_cluster_watches {}",
            self.watches.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP knit_cluster_resource_version Current resourceVersion of the store."
        );
        let _ = writeln!(out, "# TYPE knit_cluster_resource_version gauge");
        let _ = writeln!(out, "knit_cluster_resource_version {resource_version}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format() {
        let m = Arc::new(Metrics::default());
        m.record("get", "nodes".into(), 200, Duration::from_millis(2));
        m.record("get", "nodes".into(), 200, Duration::from_millis(3));
        let w = m.watch();
        let t = m.text(42);
        assert!(
            t.contains(
                "knit_cluster_requests_total{verb=\"get\",resource=\"nodes\",code=\"200\"} 2\n"
            ),
            "{t}"
        );
        assert!(t.contains("knit_cluster_watches 1\n"));
        assert!(t.contains("knit_cluster_resource_version 42\n"));
        drop(w);
        assert!(m.text(42).contains("knit_cluster_watches 0\n"));
    }
}
