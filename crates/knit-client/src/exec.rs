//! `POST /api/v1/exec`: run a command on one machine through its provider.

use crate::error::{ClientError, Result};

pub use knit_api::views::{
    ExecRequest, ExecResponse, EXEC_API_OUTPUT_MAX_BYTES, EXEC_DEFAULT_TIMEOUT_SECONDS,
    EXEC_MAX_TIMEOUT_SECONDS,
};

/// An exec answer's stdout and stderr, decoded from base64.
pub fn exec_output(answer: &ExecResponse) -> Result<(Vec<u8>, Vec<u8>)> {
    use base64::Engine;
    let decode = |field: &str, text: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| ClientError::Decode(format!("exec answer: {field} is not base64: {e}")))
    };
    Ok((
        decode("stdout", &answer.stdout)?,
        decode("stderr", &answer.stderr)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_output_is_decoded() {
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
        assert_eq!(exec_output(&answer).unwrap().0, b"hi");
        assert!(answer.stderr_cut);
    }
}
