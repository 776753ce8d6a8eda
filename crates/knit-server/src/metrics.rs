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
