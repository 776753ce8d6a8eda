//! `GET /metrics` (admin): the Prometheus text, with each pool's desired,
//! actual and ready counts.

use super::Cp;
use crate::error::Result;
use crate::metrics::PoolGauge;
use crate::reconcile::counts_toward_pool;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

pub async fn metrics(State(cp): State<Cp>) -> Result<Response> {
    let nodes = cp.store.nodes()?;
    let mut gauges = Vec::new();
    for record in cp.store.pools()? {
        let name = record.pool.metadata.name.clone();
        let actual = cp
            .store
            .instances(Some(&name))?
            .iter()
            .filter(|i| counts_toward_pool(&i.state))
            .count() as i64;
        let ready = nodes
            .iter()
            .filter(|n| n.pool == name && n.status == knit_api::state::NodeStatus::Ready)
            .count() as i64;
        gauges.push(PoolGauge {
            pool: name,
            desired: record.pool.spec.replicas,
            actual,
            ready,
        });
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        cp.metrics.render(&gauges),
    )
        .into_response())
}
