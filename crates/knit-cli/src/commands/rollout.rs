//! `knit rollout status|pause|resume|restart|undo|history pool NAME`, as
//! `kubectl rollout` for a Deployment.

use crate::error::{CliError, Result};
use crate::output::{age, cell, table};
use clap::{Subcommand, ValueEnum};
use knit_api::views::{
    PoolView, RolloutUndoRequest, ROLLOUT_COMPLETE, ROLLOUT_PAUSED, ROLLOUT_STOPPED,
    ROLLOUT_WAITING,
};
use knit_client::Client;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What rolls: pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Rollable {
    #[value(alias = "pools", alias = "nodepool")]
    Pool,
}

#[derive(Subcommand)]
pub enum RolloutAction {
    /// Follow a pool's rollout: a line each time it moves; exits 0 when
    /// every node is up to date and available, 1 when it stopped (a
    /// replacement did not come up) or --timeout passed.
    Status {
        kind: Rollable,
        name: String,
        /// Give up after this long (`10m`, `90s`, or seconds).
        #[arg(long, default_value = "600", value_parser = super::seconds)]
        timeout: u64,
        /// Print where it stands once and exit (0 when complete).
        #[arg(long)]
        no_watch: bool,
    },
    /// Stop replacing nodes (scaling still works).
    Pause { kind: Rollable, name: String },
    /// Go on replacing nodes; a rollout stopped by a replacement that did
    /// not come up tries again.
    Resume { kind: Rollable, name: String },
    /// Replace every node of the pool.
    Restart { kind: Rollable, name: String },
    /// Back to an earlier revision's template (and its labels and taints).
    Undo {
        kind: Rollable,
        name: String,
        /// The revision (`knit rollout history`); default: the previous.
        #[arg(long)]
        to_revision: Option<i64>,
    },
    /// The pool's kept revisions.
    History { kind: Rollable, name: String },
}

/// How often `rollout status` asks.
const POLL: Duration = Duration::from_millis(500);

pub fn run(c: &Client, action: RolloutAction) -> Result<ExitCode> {
    match action {
        RolloutAction::Status {
            name,
            timeout,
            no_watch,
            ..
        } => status(c, &name, Duration::from_secs(timeout), !no_watch),
        RolloutAction::Pause { name, .. } => verb(c, &name, "pause", "paused"),
        RolloutAction::Resume { name, .. } => verb(c, &name, "resume", "resumed"),
        RolloutAction::Restart { name, .. } => verb(c, &name, "restart", "restarting"),
        RolloutAction::Undo {
            name, to_revision, ..
        } => {
            let view = c.undo_pool(&name, &RolloutUndoRequest { to_revision })?;
            println!("nodepool/{} rolled back", view.metadata.name);
            Ok(ExitCode::SUCCESS)
        }
        RolloutAction::History { name, .. } => history(c, &name),
    }
}

fn verb(c: &Client, name: &str, verb: &str, done: &str) -> Result<ExitCode> {
    let view = c.rollout_pool(name, verb)?;
    println!("nodepool/{} {done}", view.metadata.name);
    Ok(ExitCode::SUCCESS)
}

/// One line of where the rollout stands, and whether it is over
/// (`Some(true)` done, `Some(false)` stopped).
pub fn progress(view: &PoolView) -> (String, Option<bool>) {
    let name = &view.metadata.name;
    let desired = view.status.desired;
    let caught_up = view.status.observed_generation >= view.metadata.generation;
    let Some(r) = &view.status.rollout else {
        return (format!("pool {name:?} is being deleted"), Some(false));
    };
    match r.state.as_str() {
        ROLLOUT_COMPLETE if caught_up => (
            format!("pool {name:?} successfully rolled out ({} of {desired} nodes up to date)", r.updated),
            Some(true),
        ),
        ROLLOUT_STOPPED => (
            format!(
                "pool {name:?} rollout stopped ({}): {}",
                r.reason.as_deref().unwrap_or("-"),
                r.message.as_deref().unwrap_or("-")
            ),
            Some(false),
        ),
        ROLLOUT_PAUSED => (
            format!(
                "Waiting for pool {name:?} rollout: paused with {} of {desired} nodes up to date (knit rollout resume pool {name})",
                r.updated
            ),
            None,
        ),
        ROLLOUT_WAITING => (
            format!(
                "Waiting for pool {name:?} rollout: updateStrategy OnDelete, {} out-of-date node(s) replaced when removed",
                r.outdated
            ),
            None,
        ),
        _ if r.outdated > 0 => (
            format!(
                "Waiting for pool {name:?} rollout to finish: {} of {desired} updated nodes are available, {} old node(s) left ({} instances, {} available)",
                r.updated_available, r.outdated, r.total, r.available
            ),
            None,
        ),
        _ => (
            format!(
                "Waiting for pool {name:?} rollout to finish: {} of {desired} updated nodes are available",
                r.updated_available
            ),
            None,
        ),
    }
}

fn status(c: &Client, name: &str, timeout: Duration, watch: bool) -> Result<ExitCode> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let view = c.get_pool(name)?.view;
        let (line, over) = progress(&view);
        if line != last {
            println!("{line}");
            last = line;
        }
        match over {
            Some(true) => return Ok(ExitCode::SUCCESS),
            Some(false) => return Ok(ExitCode::FAILURE),
            None if !watch => return Ok(ExitCode::FAILURE),
            None => {}
        }
        if started.elapsed() >= timeout {
            return Err(CliError::Failed(format!(
                "timed out after {} s waiting for pool {name:?} to roll out",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(POLL);
    }
}

fn history(c: &Client, name: &str) -> Result<ExitCode> {
    let now = super::now_ms();
    let rows: Vec<Vec<String>> = c
        .pool_revisions(name)?
        .into_iter()
        .map(|d| {
            let r = d.view;
            vec![
                cell(r.revision),
                cell(r.generation),
                cell(&r.template_hash),
                age(r.created_ms, now),
                if r.change.is_empty() {
                    "-".to_string()
                } else {
                    r.change
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &["REVISION", "GENERATION", "TEMPLATE-HASH", "AGE", "CHANGE"],
            &rows
        )
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::views::{PoolStatus, RolloutView};
    use knit_api::{NodePool, NodePoolSpec};

    fn view(state: &str, outdated: i64, generation: i64, observed: i64) -> PoolView {
        let mut v = PoolView::new(
            NodePool::new("p", NodePoolSpec::default()),
            0,
            PoolStatus {
                desired: 3,
                observed_generation: observed,
                rollout: Some(RolloutView {
                    state: state.into(),
                    outdated,
                    updated: 3 - outdated,
                    reason: Some("ProgressDeadlineExceeded".into()),
                    message: Some("replacement p-x did not come up".into()),
                    ..RolloutView::default()
                }),
                ..PoolStatus::default()
            },
        );
        v.metadata.generation = generation;
        v
    }

    #[test]
    fn status_ends_on_complete_and_caught_up_and_fails_when_stopped() {
        assert_eq!(progress(&view(ROLLOUT_COMPLETE, 0, 2, 2)).1, Some(true));
        assert_eq!(
            progress(&view(ROLLOUT_COMPLETE, 0, 3, 2)).1,
            None,
            "the reconciler has not planned the newest generation yet"
        );
        let (line, over) = progress(&view(ROLLOUT_STOPPED, 2, 2, 2));
        assert_eq!(over, Some(false));
        assert!(
            line.contains("ProgressDeadlineExceeded") && line.contains("p-x"),
            "{line}"
        );
        let (line, over) = progress(&view("Progressing", 2, 2, 2));
        assert_eq!(over, None);
        assert!(line.contains("2 old node(s) left"), "{line}");
        assert_eq!(progress(&view(ROLLOUT_PAUSED, 1, 2, 2)).1, None);
    }
}
