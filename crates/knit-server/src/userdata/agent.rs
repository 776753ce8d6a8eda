//! Asking the agent the stub installed: `knit-agent <subcommand>` run
//! through the provider's exec, its one JSON document parsed into the type
//! of [`knit_api::agent`]. The server knows the agent's subcommands, not the
//! node's files.

use crate::error::{Result, ServerError};
use crate::provider::Provider;
use knit_api::agent::{AgentFailure, AGENT_EXE};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// The largest answer read back (stdout and stderr each): answers are a
/// few kilobytes; an image report of hundreds of images stays far below.
pub const ANSWER_MAX_BYTES: usize = 1 << 20;

/// Runs `knit-agent <args>` inside instance `id` for at most `limit`.
/// `Ok(Ok(answer))`: it answered; `Ok(Err(failure))`: the agent ran and
/// reported why it failed; `Err`: it could not be run or its output is not
/// an answer (a provider error naming the command).
pub async fn ask<T: DeserializeOwned>(
    provider: &dyn Provider,
    id: &str,
    args: &[&str],
    limit: Duration,
) -> Result<std::result::Result<T, AgentFailure>> {
    let mut argv = vec![AGENT_EXE.to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let out = provider
        .exec_limited(id, &argv, limit, ANSWER_MAX_BYTES)
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fail = |why: String| ServerError::Provider {
        provider: provider.name().to_string(),
        message: format!(
            "in the instance, `knit-agent {}` {why}{}",
            args.join(" "),
            stderr_tail(&out.stderr)
        ),
    };
    if out.stdout_cut {
        return Err(fail(format!("answered more than {ANSWER_MAX_BYTES} bytes")));
    }
    if out.code == 0 {
        return serde_json::from_str::<T>(stdout.trim())
            .map(Ok)
            .map_err(|e| fail(format!("gave no answer ({e}): {:?}", clip(&stdout))));
    }
    match serde_json::from_str::<AgentFailure>(stdout.trim()) {
        Ok(failure) => Ok(Err(failure)),
        Err(_) => Err(fail(format!("exited {}: {}", out.code, clip(&stdout)))),
    }
}

/// An agent failure as one line: `<code>: <message>`.
pub fn describe(failure: &AgentFailure) -> String {
    format!("{}: {}", failure.code, failure.message)
}

fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(" (stderr: {})", clip(text))
    }
}

/// The end of a text, short enough for an event or an error (the end says
/// what went wrong).
fn clip(text: &str) -> String {
    let chars: Vec<char> = text.trim().chars().collect();
    chars[chars.len().saturating_sub(800)..].iter().collect()
}
