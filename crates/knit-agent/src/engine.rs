//! The phase engine: inspect, act only if needed, record, report. It runs
//! `phases::all()`; the `Phase` trait the phases implement is below both,
//! in `phase.rs`.

use crate::error::{AgentError, Result};
use crate::host::Host;
use crate::journal::{Journal, PhaseRecord};
use crate::phase::{context, Ctx, Decision, Phase};
use crate::phases;
use crate::report::Reporter;
use knit_api::{NodeConfig, PhaseEvent, PhaseName, PhaseOutcome};
use serde::Serialize;
use std::time::Instant;

#[derive(Debug, Clone, Serialize)]
pub struct PlannedPhase {
    pub name: PhaseName,
    pub action: &'static str,
    pub reason: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub node_name: String,
    pub data_disk: phases::data_disk::DiskPlan,
    pub phases: Vec<PlannedPhase>,
}

pub struct InitOptions {
    /// Rerun this phase even if the journal says it is done.
    pub force_phase: Option<PhaseName>,
    /// Stop after this phase (debugging, staged rollouts, tests).
    pub stop_after: Option<PhaseName>,
}

/// `knit-agent plan`: every phase's decision, and the data-disk choice, with
/// nothing changed on the machine.
pub fn plan(host: &Host, config: &NodeConfig) -> Result<Plan> {
    let ctx = context(host, config)?;
    let mut planned = Vec::new();
    for phase in phases::all() {
        let decision = if ctx.journal.is_done(phase.name()) {
            match phase.inspect(&ctx)? {
                Decision::Run(why) => Decision::Run(format!("journal says done but: {why}")),
                other => other,
            }
        } else {
            phase.inspect(&ctx)?
        };
        planned.push(PlannedPhase {
            name: phase.name(),
            action: decision.action(),
            reason: decision.reason().to_string(),
        });
    }
    Ok(Plan {
        node_name: ctx.node.name.clone(),
        data_disk: phases::data_disk::plan(&ctx)?,
        phases: planned,
    })
}

/// `knit-agent init`: runs every phase in order, stopping at the first failure.
pub fn init(host: &Host, config: &NodeConfig, options: &InitOptions) -> Result<Journal> {
    let mut ctx = match context(host, config) {
        Ok(ctx) => ctx,
        Err(e) => {
            host.log.line("init", &format!("cannot start: {e}"));
            host.log.record_error(&e);
            return Err(e);
        }
    };
    let reporter = Reporter::new(config, &ctx.node);
    host.log.line(
        "init",
        &format!(
            "initializing node {} (agent {})",
            ctx.node.name,
            env!("CARGO_PKG_VERSION")
        ),
    );
    ctx.journal.node_name = Some(ctx.node.name.clone());
    for phase in phases::all() {
        let name = phase.name();
        let result = run_phase(&mut ctx, phase.as_ref(), options, &reporter);
        if let Err(error) = result {
            host.log.line(name.as_str(), &format!("failed: {error}"));
            host.log.record_error(&error);
            let _ = ctx.save_journal();
            reporter.flush();
            return Err(error);
        }
        if options.stop_after == Some(name) {
            host.log.clear_error();
            host.log
                .line("init", &format!("stopping after {name} as asked"));
            reporter.flush();
            return Ok(ctx.journal);
        }
    }
    host.log.clear_error();
    host.log
        .line("init", &format!("node {} initialized", ctx.node.name));
    reporter.flush();
    Ok(ctx.journal)
}

/// Milliseconds since the epoch, as the journal and the reports keep them.
fn now_ms() -> u64 {
    u64::try_from(knit_os::time::now_ms()).unwrap_or(0)
}

/// One phase's run: when it started, and the external-command time before it.
struct Attempt {
    name: PhaseName,
    started_at: u64,
    clock: Instant,
    command_before: std::time::Duration,
}

fn run_phase(
    ctx: &mut Ctx,
    phase: &dyn Phase,
    options: &InitOptions,
    reporter: &Reporter,
) -> Result<()> {
    let name = phase.name();
    let attempt = Attempt {
        name,
        started_at: now_ms(),
        clock: Instant::now(),
        command_before: ctx.host.command_time(),
    };
    let forced = options.force_phase == Some(name);
    let decision = match phase.inspect(ctx) {
        Ok(Decision::Done(why)) if forced => Decision::Run(format!("forced rerun ({why})")),
        Ok(Decision::Skip(why)) if forced => Decision::Skip(format!("forced, but: {why}")),
        Ok(decision) => decision,
        Err(e) => return fail(ctx, &attempt, e, reporter),
    };
    let (outcome, reason) = match decision {
        Decision::Skip(reason) => {
            ctx.host
                .log
                .line(name.as_str(), &format!("skipped: {reason}"));
            (PhaseOutcome::Skipped, reason)
        }
        Decision::Done(reason) => {
            ctx.host
                .log
                .line(name.as_str(), &format!("already done: {reason}"));
            (PhaseOutcome::Done, reason)
        }
        Decision::Run(reason) => {
            ctx.host
                .log
                .line(name.as_str(), &format!("start: {reason}"));
            reporter.send(event(
                ctx,
                name,
                PhaseOutcome::Started,
                None,
                None,
                attempt.started_at,
                None,
            ));
            match phase.run(ctx) {
                Ok(summary) => {
                    ctx.host
                        .log
                        .line(name.as_str(), &format!("done: {summary}"));
                    (PhaseOutcome::Done, summary)
                }
                Err(e) => return fail(ctx, &attempt, e, reporter),
            }
        }
    };
    record(ctx, &attempt, outcome, Some(reason), None, reporter)
}

fn record(
    ctx: &mut Ctx,
    attempt: &Attempt,
    outcome: PhaseOutcome,
    reason: Option<String>,
    error: Option<&AgentError>,
    reporter: &Reporter,
) -> Result<()> {
    let duration_ms = attempt.clock.elapsed().as_millis() as u64;
    let command_ms = ctx
        .host
        .command_time()
        .saturating_sub(attempt.command_before)
        .as_millis() as u64;
    ctx.journal.phases.insert(
        attempt.name,
        PhaseRecord {
            outcome,
            reason: reason.clone(),
            error_code: error.map(|e| e.code),
            started_at_ms: attempt.started_at,
            duration_ms,
            command_ms,
        },
    );
    ctx.save_journal()?;
    reporter.send(event(
        ctx,
        attempt.name,
        outcome,
        reason,
        error,
        now_ms(),
        Some(duration_ms),
    ));
    Ok(())
}

fn fail(ctx: &mut Ctx, attempt: &Attempt, error: AgentError, reporter: &Reporter) -> Result<()> {
    record(
        ctx,
        attempt,
        PhaseOutcome::Failed,
        Some(error.message.clone()),
        Some(&error),
        reporter,
    )?;
    Err(error)
}

fn event(
    ctx: &Ctx,
    phase: PhaseName,
    outcome: PhaseOutcome,
    reason: Option<String>,
    error: Option<&AgentError>,
    at_ms: u64,
    duration_ms: Option<u64>,
) -> PhaseEvent {
    PhaseEvent {
        node: ctx.node.name.clone(),
        instance_id: ctx.node.instance_id.clone(),
        phase,
        outcome,
        reason,
        error_code: error.map(|e| e.code),
        at_ms,
        duration_ms,
    }
}
