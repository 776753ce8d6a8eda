//! Prometheus text-format metrics. Counters and histograms live here; pool
//! gauges are read from the store at scrape time so they never drift.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Bucket upper bounds in seconds: phases take from milliseconds to minutes.
const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.counts[i] += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, bound) in BUCKETS.iter().enumerate() {
            let n = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

#[derive(Debug, Default)]
struct Inner {
    creates: BTreeMap<String, u64>,
    create_failures: BTreeMap<String, u64>,
    deletes: BTreeMap<String, u64>,
    phase_durations: BTreeMap<String, Histogram>,
    reconcile: Histogram,
    bootstrap_refused: u64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// Per-pool numbers read from the store for one scrape.
#[derive(Debug, Clone)]
pub struct PoolGauge {
    pub pool: String,
    pub desired: i64,
    pub actual: i64,
    pub ready: i64,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn instance_created(&self, pool: &str) {
        *self.lock().creates.entry(pool.to_string()).or_default() += 1;
    }

    pub fn instance_create_failed(&self, pool: &str) {
        *self
            .lock()
            .create_failures
            .entry(pool.to_string())
            .or_default() += 1;
    }

    pub fn instance_deleted(&self, pool: &str) {
        *self.lock().deletes.entry(pool.to_string()).or_default() += 1;
    }

    pub fn phase_duration(&self, phase: &str, ms: u64) {
        self.lock()
            .phase_durations
            .entry(phase.to_string())
            .or_default()
            .observe(ms as f64 / 1000.0);
    }

    pub fn reconcile_duration(&self, seconds: f64) {
        self.lock().reconcile.observe(seconds);
    }

    pub fn bootstrap_refused(&self) {
        self.lock().bootstrap_refused += 1;
    }

    pub fn render(&self, pools: &[PoolGauge]) -> String {
        let inner = self.lock();
        let mut out = String::new();
        for (name, help, pick) in [
            (
                "knit_pool_desired_nodes",
                "Desired node count of a pool.",
                0,
            ),
            (
                "knit_pool_instances",
                "Instances a pool holds (pending, creating, running, failed).",
                1,
            ),
            (
                "knit_pool_ready_nodes",
                "Nodes of a pool whose status is Ready.",
                2,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for g in pools {
                let v = [g.desired, g.actual, g.ready][pick];
                let _ = writeln!(out, "{name}{{pool=\"{}\"}} {v}", escape(&g.pool));
            }
        }
        for (name, help, map) in [
            (
                "knit_instance_creates_total",
                "Instances created through the provider.",
                &inner.creates,
            ),
            (
                "knit_instance_create_failures_total",
                "Failed instance creations.",
                &inner.create_failures,
            ),
            (
                "knit_instance_deletes_total",
                "Instances released or detached.",
                &inner.deletes,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (pool, v) in map {
                let _ = writeln!(out, "{name}{{pool=\"{}\"}} {v}", escape(pool));
            }
        }
        let _ = writeln!(
            out,
            "# HELP knit_bootstrap_refused_total Bootstrap requests refused (unknown, used or expired token).\n# TYPE knit_bootstrap_refused_total counter\nknit_bootstrap_refused_total {}",
            inner.bootstrap_refused
        );
        let name = "knit_phase_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Duration of agent phases as reported by nodes.\n# TYPE {name} histogram"
        );
        for (phase, h) in &inner.phase_durations {
            h.render(&mut out, name, &format!("phase=\"{}\"", escape(phase)));
        }
        let name = "knit_reconcile_duration_seconds";
        let _ = writeln!(out, "# HELP {name} Time of one reconcile pass (planning and intent writes).\n# TYPE {name} histogram");
        inner.reconcile.render(&mut out, name, "");
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
    }
}
