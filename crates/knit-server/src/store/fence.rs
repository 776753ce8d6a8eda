//! The fence of leader work: the lease a task of the leader was started
//! under, carried with the task (a tokio task-local, into the tasks it
//! spawns through [`spawn`]). The store's own: `Store::write` checks it
//! inside each write transaction; `ha` puts leader work under it
//! ([`fenced`]) and re-exports these names.

use std::future::Future;

tokio::task_local! {
    static FENCE: Fence;
}

/// The lease a piece of leader work was started under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub holder: String,
    pub epoch: i64,
}

/// The fence of the leader work this task is doing, if it is.
pub fn current_fence() -> Option<Fence> {
    FENCE.try_with(Fence::clone).ok()
}

/// Runs `fut` as leader work under `fence`: its writes are refused once
/// the lease has passed to another epoch.
pub async fn fenced<F: Future>(fence: Fence, fut: F) -> F::Output {
    FENCE.scope(fence, fut).await
}

/// `tokio::spawn` that carries the current fence into the new task, so
/// work handed off by the leader stays fenced.
pub fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match current_fence() {
        Some(fence) => tokio::spawn(FENCE.scope(fence, fut)),
        None => tokio::spawn(fut),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_fence_follows_spawned_work() {
        let fence = Fence {
            holder: "a".into(),
            epoch: 3,
        };
        let seen = fenced(fence.clone(), async {
            spawn(async { current_fence() }).await.unwrap()
        })
        .await;
        assert_eq!(seen, Some(fence));
        assert_eq!(spawn(async { current_fence() }).await.unwrap(), None);
    }
}
