//! Live updates: one task reads a fingerprint of what the pages show
//! (pools, nodes, the newest event, snapshot builds) once a second while a
//! browser listens, and every open page gets a server-sent `change` event
//! when it moves; the page then fetches itself and swaps its live regions.

use super::{session::Session, Cs};
use crate::control::ControlPlane;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Extension;
use futures_util::stream::Stream;
use std::convert::Infallible;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const POLL: Duration = Duration::from_secs(1);

/// The change feed's receiving side.
pub struct Live {
    changes: watch::Receiver<u64>,
}

impl Live {
    /// The feed and its polling task (ends when `shutdown` turns true).
    pub fn start(
        cp: Arc<ControlPlane>,
        mut shutdown: watch::Receiver<bool>,
    ) -> (Live, tokio::task::JoinHandle<()>) {
        let (tx, rx) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
                // Only `Live` itself holds a receiver: nobody is listening.
                if tx.receiver_count() <= 1 {
                    continue;
                }
                match fingerprint(&cp) {
                    Ok(now) => {
                        tx.send_if_modified(|seen| {
                            let moved = *seen != now;
                            *seen = now;
                            moved
                        });
                    }
                    Err(e) => tracing::debug!(error = %e, "console change feed: read failed"),
                }
            }
        });
        (Live { changes: rx }, task)
    }
}

/// A hash of everything a console page shows that can change.
fn fingerprint(cp: &ControlPlane) -> crate::error::Result<u64> {
    let mut h = DefaultHasher::new();
    serde_json::to_string(&crate::pools::list(cp)?)
        .unwrap_or_default()
        .hash(&mut h);
    serde_json::to_string(&crate::nodes::list(cp)?)
        .unwrap_or_default()
        .hash(&mut h);
    for e in cp.store.events(1)? {
        (e.id, e.count, e.last_ms).hash(&mut h);
    }
    for b in crate::snapshot::builds(cp)? {
        serde_json::to_string(&b).unwrap_or_default().hash(&mut h);
    }
    Ok(h.finish())
}

/// `GET /ui/live`: `change` on every move of the feed; `signed-out` (and
/// the end of the stream) when the session expires.
pub async fn stream(
    State(console): State<Cs>,
    Extension(session): Extension<Session>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut changes = console.live.changes.clone();
    changes.mark_unchanged();
    let expires = tokio::time::Instant::from_std(session.expires);
    let state = Some((changes, console));
    let events = futures_util::stream::unfold(state, move |state| {
        let id = session.id.clone();
        async move {
            let (mut changes, console) = state?;
            tokio::select! {
                changed = changes.changed() => {
                    changed.ok()?;
                    // Signed out elsewhere (another tab), or expired while
                    // the feed moved: say so, then stop. (Ending the stream
                    // alone left the page where it was: the browser's
                    // reconnect meets the sign-in redirect and gives up.)
                    if console.sessions.get(&id).is_none() {
                        return Some((Ok(Event::default().event("signed-out").data("signed out")), None));
                    }
                    let version = *changes.borrow_and_update();
                    Some((Ok(Event::default().event("change").data(version.to_string())), Some((changes, console))))
                }
                _ = tokio::time::sleep_until(expires) => {
                    Some((Ok(Event::default().event("signed-out").data("expired")), None))
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
