//! Prometheus text-format metrics, kept and written by `prometheus-client`.
//! Counters and histograms live here; pool gauges are read from the store
//! at scrape time so they never drift.

use prometheus_client::encoding::{prometheus_text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Bucket upper bounds in seconds: phases take from milliseconds to minutes.
const BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Bucket upper bounds in seconds of a node's start-up: seconds on the
/// local cloud, minutes on a real cloud or a VM booted under TCG.
pub const STARTUP_BUCKETS: [f64; 16] = [
    1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
];

fn startup_histogram() -> Histogram {
    Histogram::new(STARTUP_BUCKETS)
}

/// The stages of a node's start-up, each timed from its instance's record
/// (written by the planner at the scale request's first reconcile pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartupStage {
    /// The provider answered the create with the machine (running).
    Running,
    /// The Node was first Ready in the cluster.
    Ready,
    /// The agent finished its last phase (fully initialized).
    Initialized,
}

impl StartupStage {
    pub fn as_str(self) -> &'static str {
        match self {
            StartupStage::Running => "running",
            StartupStage::Ready => "ready",
            StartupStage::Initialized => "initialized",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartupLabels {
    pool: String,
    provider: String,
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

type PoolCounters = Family<PoolLabels, Counter>;

#[derive(Debug)]
pub struct Metrics {
    creates: PoolCounters,
    create_failures: PoolCounters,
    deletes: PoolCounters,
    phase_durations: Family<PhaseLabels, Histogram, fn() -> Histogram>,
    reconcile: Histogram,
    bootstrap_refused: Counter,
    startup: Family<StartupLabels, Histogram, fn() -> Histogram>,
    kube_events: Family<OutcomeLabels, Counter>,
    /// The metrics reader token (`crate::http::metrics`): reads `/metrics`
    /// and nothing else.
    reader_token: std::sync::OnceLock<String>,
    /// The listeners' connection counters (`crate::server`).
    pub connections: knit_cluster::conn::ConnectionMetrics,
    /// Node reports refused: over the per-node rate, or too large.
    reports_refused: Family<ReasonLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            creates: PoolCounters::default(),
            create_failures: PoolCounters::default(),
            deletes: PoolCounters::default(),
            phase_durations: Family::new_with_constructor(duration_histogram),
            reconcile: duration_histogram(),
            bootstrap_refused: Counter::default(),
            startup: Family::new_with_constructor(startup_histogram),
            kube_events: Family::default(),
            reader_token: std::sync::OnceLock::new(),
            connections: knit_cluster::conn::ConnectionMetrics::default(),
            reports_refused: Family::default(),
        }
    }
}

/// Per-pool numbers read from the store for one scrape.
#[derive(Debug, Clone)]
pub struct PoolGauge {
    pub pool: String,
    pub desired: i64,
    pub actual: i64,
    pub ready: i64,
}

fn pool(name: &str) -> PoolLabels {
    PoolLabels {
        pool: name.to_string(),
    }
}

impl Metrics {
    pub fn instance_created(&self, pool_name: &str) {
        self.creates.get_or_create(&pool(pool_name)).inc();
    }

    pub fn instance_create_failed(&self, pool_name: &str) {
        self.create_failures.get_or_create(&pool(pool_name)).inc();
    }

    pub fn instance_deleted(&self, pool_name: &str) {
        self.deletes.get_or_create(&pool(pool_name)).inc();
    }

    pub fn phase_duration(&self, phase: &str, ms: u64) {
        self.phase_durations
            .get_or_create(&PhaseLabels {
                phase: phase.to_string(),
            })
            .observe(ms as f64 / 1000.0);
    }

    pub fn reconcile_duration(&self, seconds: f64) {
        self.reconcile.observe(seconds);
    }

    pub fn bootstrap_refused(&self) {
        self.bootstrap_refused.inc();
    }

    /// Sets the metrics reader token (once; `false` when one is set).
    pub fn set_reader_token(&self, token: String) -> bool {
        self.reader_token.set(token).is_ok()
    }

    /// The metrics reader token, once the server set it.
    pub fn reader_token(&self) -> Option<&str> {
        self.reader_token.get().map(String::as_str)
    }

    /// One node reached `stage` of its start-up `since_ms` after its
    /// instance was recorded at `created_ms` (a clock step back counts 0).
    pub fn node_startup(
        &self,
        stage: StartupStage,
        pool: &str,
        provider: &str,
        created_ms: i64,
        now_ms: i64,
    ) {
        self.startup
            .get_or_create(&StartupLabels {
                pool: pool.to_string(),
                provider: provider.to_string(),
                stage: stage.as_str().to_string(),
            })
            .observe((now_ms - created_ms).max(0) as f64 / 1000.0);
    }

    /// One of knit's events about a node, written to the cluster as a
    /// Kubernetes Event (`published`), not written (`failed`, `dropped` from
    /// a full queue) or not for the cluster (`skipped`).
    /// A node report refused for `reason` (`rate`, `size`).
    pub fn report_refused(&self, reason: &'static str) {
        self.reports_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn kube_event(&self, outcome: &str) {
        self.kube_events
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The text of one scrape: the pool gauges of `pools`, then the kept
    /// counters and histograms. Help texts are given without their final
    /// period: the registry adds it.
    pub fn render(&self, pools: &[PoolGauge]) -> String {
        let mut registry = Registry::default();
        for (name, help, pick) in [
            ("knit_pool_desired_nodes", "Desired node count of a pool", 0),
            (
                "knit_pool_instances",
                "Instances a pool holds (pending, creating, running, failed)",
                1,
            ),
            (
                "knit_pool_ready_nodes",
                "Nodes of a pool whose status is Ready",
                2,
            ),
        ] {
            let gauges = Family::<PoolLabels, Gauge>::default();
            for g in pools {
                gauges
                    .get_or_create(&pool(&g.pool))
                    .set([g.desired, g.actual, g.ready][pick]);
            }
            registry.register(name, help, gauges);
        }
        for (name, help, counters) in [
            (
                "knit_instance_creates",
                "Instances created through the provider",
                &self.creates,
            ),
            (
                "knit_instance_create_failures",
                "Failed instance creations",
                &self.create_failures,
            ),
            (
                "knit_instance_deletes",
                "Instances released or detached",
                &self.deletes,
            ),
        ] {
            registry.register(name, help, counters.clone());
        }
        registry.register(
            "knit_bootstrap_refused",
            "Bootstrap requests refused (unknown, used or expired token)",
            self.bootstrap_refused.clone(),
        );
        registry.register(
            "knit_phase_duration_seconds",
            "Duration of agent phases as reported by nodes",
            self.phase_durations.clone(),
        );
        registry.register(
            "knit_reconcile_duration_seconds",
            "Time of one reconcile pass (planning and intent writes)",
            self.reconcile.clone(),
        );
        registry.register(
            "knit_node_startup_seconds",
            "Time from an instance's record (the scale request) to each stage of its node's start-up: running (the provider made the machine), ready (the Node first Ready), initialized (every agent phase finished)",
            self.startup.clone(),
        );
        registry.register(
            "knit_kube_events",
            "knit's node events written to the cluster as Kubernetes Events, by outcome (published, failed, dropped, skipped)",
            self.kube_events.clone(),
        );
        registry.register(
            "knit_reports_refused",
            "Node reports refused, by reason (rate: over the node's allowance; size: body too large)",
            self.reports_refused.clone(),
        );
        self.connections.register(&mut registry);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.instance_created("a");
        m.instance_created("a");
        m.phase_duration("data-disk", 40);
        m.reconcile_duration(0.002);
        let text = m.render(&[PoolGauge {
            pool: "a".into(),
            desired: 3,
            actual: 2,
            ready: 1,
        }]);
        assert!(text.contains("knit_pool_desired_nodes{pool=\"a\"} 3"));
        assert!(text.contains("knit_instance_creates_total{pool=\"a\"} 2"));
        assert!(
            text.contains("knit_phase_duration_seconds_bucket{phase=\"data-disk\",le=\"0.05\"} 1")
        );
        assert!(
            text.contains("knit_phase_duration_seconds_bucket{phase=\"data-disk\",le=\"0.01\"} 0")
        );
        assert!(text.contains("knit_reconcile_duration_seconds_count 1"));
        m.bootstrap_refused();
        m.instance_create_failed("a");
        m.instance_deleted("a");
        let text = m.render(&[PoolGauge {
            pool: "a".into(),
            desired: 3,
            actual: 2,
            ready: 1,
        }]);
        assert!(text.contains("knit_bootstrap_refused_total 1\n"), "{text}");
        m.node_startup(StartupStage::Ready, "a", "local", 1_000, 5_500);
        m.kube_event("published");
        let startup = m.render(&[]);
        let series =
            "knit_node_startup_seconds_bucket{pool=\"a\",provider=\"local\",stage=\"ready\",le=";
        assert!(startup.contains(&format!("{series}\"3\"}} 0")), "{startup}");
        assert!(startup.contains(&format!("{series}\"5\"}} 1")), "{startup}");
        assert!(
            startup.contains(
                "knit_node_startup_seconds_sum{pool=\"a\",provider=\"local\",stage=\"ready\"} 4.5"
            ),
            "{startup}"
        );
        assert!(
            startup.contains("knit_kube_events_total{outcome=\"published\"} 1"),
            "{startup}"
        );
        // Names, types and help texts as before the move to prometheus-client
        // (a family with no series yet is left out of the text).
        for pair in [
            "# HELP knit_pool_desired_nodes Desired node count of a pool.\n# TYPE knit_pool_desired_nodes gauge\n",
            "# HELP knit_pool_instances Instances a pool holds (pending, creating, running, failed).\n# TYPE knit_pool_instances gauge\n",
            "# HELP knit_pool_ready_nodes Nodes of a pool whose status is Ready.\n# TYPE knit_pool_ready_nodes gauge\n",
            "# HELP knit_instance_creates_total Instances created through the provider.\n# TYPE knit_instance_creates_total counter\n",
            "# HELP knit_instance_create_failures_total Failed instance creations.\n# TYPE knit_instance_create_failures_total counter\n",
            "# HELP knit_instance_deletes_total Instances released or detached.\n# TYPE knit_instance_deletes_total counter\n",
            "# HELP knit_bootstrap_refused_total Bootstrap requests refused (unknown, used or expired token).\n# TYPE knit_bootstrap_refused_total counter\n",
            "# HELP knit_phase_duration_seconds Duration of agent phases as reported by nodes.\n# TYPE knit_phase_duration_seconds histogram\n",
            "# HELP knit_reconcile_duration_seconds Time of one reconcile pass (planning and intent writes).\n# TYPE knit_reconcile_duration_seconds histogram\n",
        ] {
            assert!(text.contains(pair), "{pair} in {text}");
        }
    }
}
