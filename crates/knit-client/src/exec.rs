//! `POST /api/v1/exec`: run a command on one machine through its provider.

use crate::error::{ClientError, Result};
use serde::{Deserialize, Serialize};

/// `knit exec`'s default time limit for the command.
pub const EXEC_DEFAULT_TIMEOUT_SECONDS: u64 = 60;
/// The longest `timeoutSeconds` an exec request may ask for: `knit exec`
/// is for short commands; a request holds its connection that long.
pub const EXEC_MAX_TIMEOUT_SECONDS: u64 = 300;
/// Largest stdout, and largest stderr, `POST /api/v1/exec` answers: a
/// longer stream is cut there (`stdoutCut`/`stderrCut`). Smaller than the
/// provider's cap: it travels base64-encoded in one JSON answer.
pub const EXEC_API_OUTPUT_MAX_BYTES: usize = 4 << 20;

/// `POST /api/v1/exec`: run a command on one machine through its provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    /// `node` (a node's name) or `instance` (knit's instance name).
    pub kind: String,
    pub name: String,
    /// The command and its arguments, run as given (no shell, no quoting).
    pub argv: Vec<String>,
    /// 1 ..= [`EXEC_MAX_TIMEOUT_SECONDS`]; default
    /// [`EXEC_DEFAULT_TIMEOUT_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// The answer to an [`ExecRequest`]: the command's exit code and output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResponse {
    /// knit's instance name and the provider's id of the machine.
    pub instance: String,
    pub provider_id: String,
    /// The command's exit status; -1 when it ended by a signal.
    pub exit_code: i32,
    /// base64 (standard alphabet) of the bytes the command wrote.
    pub stdout: String,
    pub stderr: String,
    /// The stream was longer than [`EXEC_API_OUTPUT_MAX_BYTES`] and was cut.
    pub stdout_cut: bool,
    pub stderr_cut: bool,
}

impl ExecResponse {
    /// Decoded stdout and stderr.
    pub fn output(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        use base64::Engine;
        let decode = |field: &str, text: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| {
                    ClientError::Decode(format!("exec answer: {field} is not base64: {e}"))
                })
        };
        Ok((
            decode("stdout", &self.stdout)?,
            decode("stderr", &self.stderr)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON names the server reads and answers with.
    #[test]
    fn wire_names() {
        let req = ExecRequest {
            kind: "node".into(),
            name: "n-1".into(),
            argv: vec!["true".into()],
            timeout_seconds: Some(5),
        };
        assert_eq!(
            serde_json::to_string(&req).unwrap(),
            r#"{"kind":"node","name":"n-1","argv":["true"],"timeoutSeconds":5}"#
        );
        let answer: ExecResponse = serde_json::from_str(
            r#"{"instance":"i","providerId":"p","exitCode":3,"stdout":"aGk=","stderr":"","stdoutCut":false,"stderrCut":true}"#,
        )
        .unwrap();
        assert_eq!(answer.output().unwrap().0, b"hi");
        assert!(answer.stderr_cut);
    }
}
