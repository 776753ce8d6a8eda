//! Request and watch metrics of the embedded API, in the Prometheus text
//! format (served at `/metrics` to admins, and available to the control
//! plane through `EmbeddedCluster::metrics_text`), kept and written by
//! `prometheus-client`.

use prometheus_client::encoding::{prometheus_text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Upper bounds (seconds) of the latency histogram buckets.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    resource: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    verb: &'static str,
    resource: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<RequestLabels, Counter<f64, AtomicU64>>,
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
    watches: Gauge,
    resource_version: Gauge,
    /// The listener's connection counters (`add_connections`).
    connections: std::sync::Mutex<Option<crate::conn::ConnectionMetrics>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let request_seconds = Family::<RequestLabels, Counter<f64, AtomicU64>>::default();
        let latency: Family<LatencyLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let watches = Gauge::default();
        let resource_version = Gauge::default();
        let mut registry = Registry::default();
        // Help texts without their final period: the registry adds it.
        registry.register(
            "knit_cluster_requests",
            "API requests by verb, resource and HTTP code",
            requests.clone(),
        );
        registry.register(
            "knit_cluster_request_seconds",
            "Time spent answering API requests (watches: until the stream is set up)",
            request_seconds.clone(),
        );
        registry.register(
            "knit_cluster_request_duration_seconds",
            "API request latency by verb and resource (watches: until the stream is set up)",
            latency.clone(),
        );
        registry.register(
            "knit_cluster_watches",
            "Open watch streams",
            watches.clone(),
        );
        registry.register(
            "knit_cluster_resource_version",
            "Current resourceVersion of the store",
            resource_version.clone(),
        );
        Metrics {
            registry,
            requests,
            request_seconds,
            latency,
            watches,
            resource_version,
            connections: std::sync::Mutex::new(None),
        }
    }
}

/// Counts an open watch for as long as it lives.
pub struct WatchGuard(Arc<Metrics>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.watches.dec();
    }
}

impl Metrics {
    pub fn record(&self, verb: &'static str, resource: String, code: u16, took: Duration) {
        let secs = took.as_secs_f64();
        self.latency
            .get_or_create(&LatencyLabels {
                verb,
                resource: resource.clone(),
            })
            .observe(secs);
        let labels = RequestLabels {
            verb,
            resource,
            code,
        };
        self.requests.get_or_create(&labels).inc();
        self.request_seconds.get_or_create(&labels).inc_by(secs);
    }

    pub fn watch(self: &Arc<Self>) -> WatchGuard {
        self.watches.inc();
        WatchGuard(self.clone())
    }

    /// Serves the connection counters of the API's listener with the rest.
    pub fn add_connections(&self, connections: &crate::conn::ConnectionMetrics) {
        let mut extra = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        *extra = Some(connections.clone());
    }

    pub fn text(&self, resource_version: u64) -> String {
        self.resource_version
            .set(i64::try_from(resource_version).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        let extra = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = extra.as_ref() {
            let mut registry = Registry::default();
            c.register(&mut registry);
            let mut more = String::new();
            let _ = prometheus_text::encode(&mut more, &registry);
            out.push_str(&more);
        }
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
        assert!(t.contains("knit_cluster_request_seconds_total{verb=\"get\",resource=\"nodes\",code=\"404\"} 3"), "{t}");
        // Names, types and help texts as before the move to prometheus-client.
        for line in [
            "# HELP knit_cluster_requests_total API requests by verb, resource and HTTP code.\n# TYPE knit_cluster_requests_total counter\n",
            "# HELP knit_cluster_request_seconds_total Time spent answering API requests (watches: until the stream is set up).\n# TYPE knit_cluster_request_seconds_total counter\n",
            "# HELP knit_cluster_request_duration_seconds API request latency by verb and resource (watches: until the stream is set up).\n# TYPE knit_cluster_request_duration_seconds histogram\n",
            "# HELP knit_cluster_watches Open watch streams.\n# TYPE knit_cluster_watches gauge\n",
            "# HELP knit_cluster_resource_version Current resourceVersion of the store.\n# TYPE knit_cluster_resource_version gauge\n",
        ] {
            assert!(t.contains(line), "{line} in {t}");
        }
        drop(w);
        assert!(m.text(42).contains("knit_cluster_watches 0\n"));
    }
}
