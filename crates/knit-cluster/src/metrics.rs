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

/// Upper bounds (seconds) of the latency histogram buckets.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Latency histogram of one (verb, resource).
#[derive(Default, Clone)]
struct Histogram {
    /// Requests at or below each bound of `BUCKETS` (not cumulative here).
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
pub struct Metrics {
    /// labels → (count, total seconds)
    requests: Mutex<BTreeMap<Labels, (u64, f64)>>,
    /// (verb, resource) → latency histogram
    latency: Mutex<BTreeMap<(&'static str, String), Histogram>>,
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
        let secs = took.as_secs_f64();
        if let Ok(mut m) = self.latency.lock() {
            let h = m.entry((verb, resource.clone())).or_default();
            if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
                h.counts[i] += 1;
            }
            h.count += 1;
            h.sum += secs;
        }
        if let Ok(mut m) = self.requests.lock() {
            let e = m.entry((verb, resource, code)).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += secs;
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
        let _ = writeln!(out, "# HELP knit_cluster_request_duration_seconds API request latency by verb and resource (watches: until the stream is set up).");
        let _ = writeln!(
            out,
            "# TYPE knit_cluster_request_duration_seconds histogram"
        );
        let latency: Vec<_> = self
            .latency
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        for ((verb, resource), h) in &latency {
            let labels = format!("verb=\"{verb}\",resource=\"{resource}\"");
            let mut cumulative = 0;
            for (bound, n) in BUCKETS.iter().zip(h.counts) {
                cumulative += n;
                let _ = writeln!(
                    out,
                    "knit_cluster_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "knit_cluster_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "knit_cluster_request_duration_seconds_sum{{{labels}}} {:.6}",
                h.sum
            );
            let _ = writeln!(
                out,
                "knit_cluster_request_duration_seconds_count{{{labels}}} {}",
                h.count
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
        m.record("get", "nodes".into(), 404, Duration::from_secs(3));
        let w = m.watch();
        let t = m.text(42);
        assert!(
            t.contains(
                "knit_cluster_requests_total{verb=\"get\",resource=\"nodes\",code=\"200\"} 2\n"
            ),
            "{t}"
        );
        assert!(t.contains("knit_cluster_watches 1\n"));
        for line in [
            "knit_cluster_request_duration_seconds_bucket{verb=\"get\",resource=\"nodes\",le=\"0.005\"} 2\n",
            "knit_cluster_request_duration_seconds_bucket{verb=\"get\",resource=\"nodes\",le=\"2.5\"} 2\n",
            "knit_cluster_request_duration_seconds_bucket{verb=\"get\",resource=\"nodes\",le=\"5\"} 3\n",
            "knit_cluster_request_duration_seconds_bucket{verb=\"get\",resource=\"nodes\",le=\"+Inf\"} 3\n",
            "knit_cluster_request_duration_seconds_count{verb=\"get\",resource=\"nodes\"} 3\n",
        ] {
            assert!(t.contains(line), "{line} in {t}");
        }
        assert!(t.contains("knit_cluster_resource_version 42\n"));
        drop(w);
        assert!(m.text(42).contains("knit_cluster_watches 0\n"));
    }
}
