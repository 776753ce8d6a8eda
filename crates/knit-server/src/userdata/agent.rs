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
    let fail = |why: String| {
        ServerError::from(crate::provider::ProviderError::failed(
            provider.name(),
            format!(
                "in the instance, `knit-agent {}` {why}{}",
                args.join(" "),
                stderr_tail(&out.stderr)
            ),
        ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{InstanceTemplate, ProviderInstance, ProviderSnapshot};
    use async_trait::async_trait;
    use knit_api::agent::SystemImages;

    /// A provider whose exec answers with one canned exit status and
    /// stdout, and records the argv; nothing else is asked of it here.
    struct CannedExec {
        code: i32,
        stdout: String,
        argv: std::sync::Mutex<Vec<String>>,
    }

    fn refused<T>() -> Result<T> {
        Err(ServerError::from(crate::provider::ProviderError::failed(
            "canned",
            "not part of this test",
        )))
    }

    #[async_trait]
    impl Provider for CannedExec {
        fn name(&self) -> &str {
            "canned"
        }
        async fn create(&self, _: &InstanceTemplate) -> Result<ProviderInstance> {
            refused()
        }
        async fn get(&self, _: &str) -> Result<Option<ProviderInstance>> {
            refused()
        }
        async fn list(&self) -> Result<Vec<ProviderInstance>> {
            refused()
        }
        async fn start(&self, _: &str) -> Result<()> {
            refused()
        }
        async fn stop(&self, _: &str) -> Result<()> {
            refused()
        }
        async fn reimage(&self, _: &str, _: &str, _: &str) -> Result<()> {
            refused()
        }
        async fn check_image(&self, _: &str) -> Result<()> {
            refused()
        }
        async fn rename(&self, _: &str, _: &str) -> Result<()> {
            refused()
        }
        async fn set_password(&self, _: &str, _: &str) -> Result<()> {
            refused()
        }
        async fn delete(&self, _: &str) -> Result<()> {
            refused()
        }
        async fn read_file(&self, _: &str, _: &str) -> Result<Vec<u8>> {
            refused()
        }
        async fn snapshot_create(&self, _: &str, _: usize, _: &str) -> Result<ProviderSnapshot> {
            refused()
        }
        async fn snapshot_delete(&self, _: &str) -> Result<()> {
            refused()
        }
        async fn exec(&self, _: &str, argv: &[String]) -> Result<(i32, Vec<u8>, Vec<u8>)> {
            *self.argv.lock().unwrap() = argv.to_vec();
            Ok((self.code, self.stdout.clone().into_bytes(), Vec::new()))
        }
    }

    fn ask_canned(
        code: i32,
        stdout: &str,
    ) -> (
        Result<std::result::Result<SystemImages, AgentFailure>>,
        Vec<String>,
    ) {
        let provider = CannedExec {
            code,
            stdout: stdout.into(),
            argv: Default::default(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = rt.block_on(ask::<SystemImages>(
            &provider,
            "i-1",
            &["snapshot-prepare", "system-images"],
            Duration::from_secs(5),
        ));
        let argv = provider.argv.lock().unwrap().clone();
        (answer, argv)
    }

    /// The agent's answer, its own failure, and output that is neither.
    #[test]
    fn ask_parses_the_answer_or_the_agents_failure() {
        let (answer, argv) = ask_canned(0, "{\"images\":[\"pause:3.9\"]}\n");
        assert_eq!(
            argv,
            [AGENT_EXE, "snapshot-prepare", "system-images"].map(String::from)
        );
        assert_eq!(answer.unwrap().unwrap().images, ["pause:3.9"]);
        let (answer, _) = ask_canned(1, "{\"code\":\"FailCommand\",\"message\":\"no\"}");
        let failure = answer.unwrap().unwrap_err();
        assert_eq!(describe(&failure), "FailCommand: no");
        let (answer, _) = ask_canned(127, "sh: knit-agent: not found");
        let e = answer.unwrap_err().to_string();
        assert!(
            e.contains("`knit-agent snapshot-prepare system-images` exited 127"),
            "{e}"
        );
        let (answer, _) = ask_canned(0, "not json");
        assert!(answer.unwrap_err().to_string().contains("gave no answer"));
    }
}
