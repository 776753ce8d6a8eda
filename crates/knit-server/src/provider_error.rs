//! The one error a [`Provider`](crate::provider::Provider) returns: a
//! kind callers decide on (the instance-type fallback moves on for
//! [`Capacity`], `get` answers `None` for [`NotFound`] …), the provider's
//! own code and its message. Each provider maps its errors into it where
//! they leave it (`ecs::kind_of` by ECS's error Code, `local::kind_of` by
//! `LocalError`'s variant, `qemu::kind_of` by `QemuError`'s); nothing past
//! that edge reads an error's text to decide what it was. A room of its
//! own, below `error` and `store`: `ServerError` carries it and the store
//! keeps its kind beside a failure's text, neither importing the
//! providers.
//!
//! [`Capacity`]: ProviderErrorKind::Capacity
//! [`NotFound`]: ProviderErrorKind::NotFound

use std::time::Duration;

/// What kind of failure a provider error is, which decides what a caller
/// does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderErrorKind {
    /// The instance, disk, snapshot or image named does not exist.
    NotFound,
    /// The provider refused for the rate of calls; the same call later
    /// may pass.
    Throttled,
    /// No room for this instance type here now (ECS
    /// `OperationDenied.NoStock`, the local cloud's per-type capacity);
    /// another type may have room.
    Capacity,
    /// Credentials missing, wrong or without the permission.
    Auth,
    /// A failure that may pass by itself: no answer, a server error, a
    /// call past its time limit, a machine busy or between states.
    Transient,
    /// A failure the same call will meet again: a bad argument, an image
    /// refused, an answer over its size limit.
    Permanent,
}

impl ProviderErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: &'static [ProviderErrorKind] = &[
        ProviderErrorKind::NotFound,
        ProviderErrorKind::Throttled,
        ProviderErrorKind::Capacity,
        ProviderErrorKind::Auth,
        ProviderErrorKind::Transient,
        ProviderErrorKind::Permanent,
    ];

    /// The kind's stable name (for logs and docs, and the word the store
    /// keeps beside a recorded error's text: never rename one).
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderErrorKind::NotFound => "NotFound",
            ProviderErrorKind::Throttled => "Throttled",
            ProviderErrorKind::Capacity => "Capacity",
            ProviderErrorKind::Auth => "Auth",
            ProviderErrorKind::Transient => "Transient",
            ProviderErrorKind::Permanent => "Permanent",
        }
    }
}

impl std::fmt::Display for ProviderErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kind as the store keeps it: its name; another word is refused,
/// naming the words allowed.
impl std::str::FromStr for ProviderErrorKind {
    type Err = knit_api::FieldError;

    fn from_str(word: &str) -> Result<Self, knit_api::FieldError> {
        ProviderErrorKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == word)
            .ok_or_else(|| {
                let allowed: Vec<&str> =
                    ProviderErrorKind::ALL.iter().map(|k| k.as_str()).collect();
                knit_api::FieldError {
                    field: "provider.errorKind".to_string(),
                    value: format!("{word:?}"),
                    rule: format!("must be one of {}", allowed.join(", ")),
                }
            })
    }
}

/// knit's code for a call that went past its time limit.
pub const CODE_TIMED_OUT: &str = "ProviderTimedOut";
/// knit's code for an answer (a file read, a command's output) over its
/// size limit.
pub const CODE_TOO_LARGE: &str = "ProviderTooLarge";
/// knit's code for a request knit itself refuses before asking the
/// provider (a bad image, a bad setting).
pub const CODE_REFUSED: &str = "ProviderRefused";
/// knit's code for a failure with no code of the provider's own (a
/// command inside an instance failed, an answer knit cannot read).
pub const CODE_FAILED: &str = "ProviderFailed";

/// A provider's failure. Shown as `provider <name>: <message>` (the message
/// as each provider wrote it before there were kinds: users and tests read
/// it); `ServerError::code` stays `ProviderError` for all of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("provider {provider}: {message}")]
pub struct ProviderError {
    /// The provider's short name (`local`, `qemu`, `ecs`).
    pub provider: String,
    pub kind: ProviderErrorKind,
    /// The provider's own code (`OperationDenied.NoStock`,
    /// `LocalOutOfCapacity`, `QemuBusy`) or one of knit's `CODE_*`.
    pub code: String,
    pub message: String,
}

impl ProviderError {
    pub fn new(
        provider: impl Into<String>,
        kind: ProviderErrorKind,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> ProviderError {
        ProviderError {
            provider: provider.into(),
            kind,
            code: code.into(),
            message: message.into(),
        }
    }

    /// A request knit refuses itself (a bad image or setting): the same
    /// request fails again.
    pub fn refused(provider: impl Into<String>, message: impl Into<String>) -> ProviderError {
        ProviderError::new(
            provider,
            ProviderErrorKind::Permanent,
            CODE_REFUSED,
            message,
        )
    }

    /// A failure without a code of the provider's own.
    pub fn failed(provider: impl Into<String>, message: impl Into<String>) -> ProviderError {
        ProviderError::new(provider, ProviderErrorKind::Permanent, CODE_FAILED, message)
    }

    /// `what` did not finish within `limit`.
    pub fn timed_out(provider: impl Into<String>, what: &str, limit: Duration) -> ProviderError {
        ProviderError::timed_out_message(
            provider,
            format!("{what} did not finish within {} s", limit.as_secs()),
        )
    }

    /// A call past its time limit, the message written by the caller.
    pub fn timed_out_message(
        provider: impl Into<String>,
        message: impl Into<String>,
    ) -> ProviderError {
        ProviderError::new(
            provider,
            ProviderErrorKind::Transient,
            CODE_TIMED_OUT,
            message,
        )
    }

    /// An answer over its size limit, the message naming what and the
    /// limit.
    pub fn too_large(provider: impl Into<String>, message: impl Into<String>) -> ProviderError {
        ProviderError::new(
            provider,
            ProviderErrorKind::Permanent,
            CODE_TOO_LARGE,
            message,
        )
    }

    /// Whether this is a call past its time limit or an answer past its
    /// size limit (knit's limits, not the provider's failure).
    pub fn is_limit(&self) -> bool {
        self.code == CODE_TIMED_OUT || self.code == CODE_TOO_LARGE
    }
}

/// For the providers' mapping tests: each error becomes a provider error
/// of its kind, with its own code, shown as `provider NAME: ERROR [CODE]`.
#[cfg(test)]
pub(crate) fn assert_maps_to_kinds<E: std::fmt::Display>(
    provider: &str,
    cases: Vec<(E, ProviderErrorKind)>,
    code_of: impl Fn(&E) -> &'static str,
    map: impl Fn(E) -> crate::error::ServerError,
) {
    for (e, kind) in cases {
        let code = code_of(&e);
        let text = format!("provider {provider}: {e} [{code}]");
        match map(e) {
            crate::error::ServerError::Provider(p) => {
                assert_eq!((p.kind, p.code.as_str()), (kind, code), "{text}");
                assert_eq!(p.to_string(), text);
            }
            other => panic!("not a provider error: {other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_name_and_another_word_is_refused() {
        for kind in ProviderErrorKind::ALL {
            assert_eq!(kind.as_str().parse::<ProviderErrorKind>(), Ok(*kind));
        }
        let err = "capacity"
            .parse::<ProviderErrorKind>()
            .expect_err("names are case-sensitive");
        assert_eq!(err.field, "provider.errorKind");
        assert_eq!(
            err.rule,
            "must be one of NotFound, Throttled, Capacity, Auth, Transient, Permanent"
        );
    }

    #[test]
    fn the_message_is_shown_as_before_and_limits_are_told_by_code() {
        let e = ProviderError::timed_out("local", "creating the instance", Duration::from_secs(9));
        assert_eq!(
            e.to_string(),
            "provider local: creating the instance did not finish within 9 s"
        );
        assert_eq!(e.kind, ProviderErrorKind::Transient);
        assert!(e.is_limit());
        assert!(ProviderError::too_large("ecs", "x is larger than 1 bytes").is_limit());
        // A message that merely reads like a limit is not one.
        let lookalike = ProviderError::failed("ecs", "a did not finish within 3 s");
        assert!(!lookalike.is_limit());
        assert_eq!(lookalike.kind, ProviderErrorKind::Permanent);
    }
}
