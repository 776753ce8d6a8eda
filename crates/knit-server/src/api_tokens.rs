//! API tokens as managed objects (`knit token create|list|revoke`): who a
//! bearer secret is, with which role, and the token life cycle. The HTTP
//! edge (`http::auth`) asks [`authenticate`] on every request; the store
//! keeps only each secret's SHA-256.

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::pki;
use crate::store::{now_ms, ApiTokenRecord, TokenCheck, LAST_USED_GRANULARITY_MS};
use knit_api::state::TokenRole;
use knit_api::views::{ApiTokenView, TokenCreateRequest, TokenCreated, TokenRevoked};
use knit_api::{ApiError, FieldError};
use std::sync::Arc;

/// The longest description kept (a note for people, not a document).
pub const MAX_DESCRIPTION_CHARS: usize = 200;
/// The longest TTL taken: ten years (longer is "until revoked": no TTL).
pub const MAX_TTL_SECONDS: u64 = 10 * 365 * 86_400;

/// A new token id: `tok-` and 12 hex digits (not secret).
fn new_id() -> Result<String> {
    Ok(format!("tok-{}", pki::random_hex(6)?))
}

/// Stores the server's admin token file as the first admin token, once
/// (see `Store::seed_first_admin_token`): existing client configs and
/// kubeconfig-like files holding it keep working.
pub fn seed_first_admin(cp: &ControlPlane) -> Result<()> {
    let id = new_id()?;
    if let Some(id) = cp
        .store
        .seed_first_admin_token(&id, &pki::token_hash(&cp.admin_token))?
    {
        tracing::info!(token = %id, "the admin token file is stored as the first admin token");
    }
    Ok(())
}

pub fn view(t: &ApiTokenRecord, current: Option<&str>) -> ApiTokenView {
    ApiTokenView {
        id: t.id.clone(),
        role: t.role,
        description: t.description.clone(),
        created_ms: t.created_ms,
        expires_ms: t.expires_ms,
        last_used_ms: t.last_used_ms,
        current: current == Some(t.id.as_str()),
    }
}

/// The live token a bearer secret is, or why it is refused (401 each).
/// A use is recorded (at most once a minute per token, off the request).
pub fn authenticate(cp: &Arc<ControlPlane>, secret: Option<&str>) -> Result<ApiTokenRecord> {
    let Some(secret) = secret.filter(|s| !s.is_empty()) else {
        return Err(ServerError::Unauthorized(
            "send an API token as `Authorization: Bearer <token>` (knit token create; the first admin token is the server's state directory file admin-token)".into(),
        ));
    };
    let now = now_ms();
    match cp.store.check_api_token(&pki::token_hash(secret), now)? {
        TokenCheck::Live(t) => {
            record_use(cp, &t.id, t.last_used_ms, now);
            Ok(t)
        }
        TokenCheck::Unknown => Err(ServerError::Unauthorized(
            "the bearer token is not a token of this server".into(),
        )),
        TokenCheck::Revoked { id, .. } => Err(ServerError::Unauthorized(format!(
            "token {id} was revoked: ask an admin for another (knit token create)"
        ))),
        TokenCheck::Expired { id, .. } => Err(ServerError::Unauthorized(format!(
            "token {id} expired: ask an admin for another (knit token create)"
        ))),
    }
}

/// The token of a console session, by id, while it is live.
pub fn live_by_id(cp: &Arc<ControlPlane>, id: &str) -> Result<Option<ApiTokenRecord>> {
    let now = now_ms();
    let token = cp.store.api_token(id)?.filter(|t| t.is_live(now));
    if let Some(t) = &token {
        record_use(cp, &t.id, t.last_used_ms, now);
    }
    Ok(token)
}

/// Writes the token's last use in a blocking task, never on the request's
/// path, when neither the database nor this server wrote one within
/// [`LAST_USED_GRANULARITY_MS`].
fn record_use(cp: &Arc<ControlPlane>, id: &str, stored: Option<i64>, now: i64) {
    if stored.is_some_and(|u| now - u < LAST_USED_GRANULARITY_MS) {
        return;
    }
    {
        let mut uses = cp
            .token_uses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if uses
            .get(id)
            .is_some_and(|u| now - u < LAST_USED_GRANULARITY_MS)
        {
            return;
        }
        // Bounded: entries older than the granularity decide nothing.
        if uses.len() >= 4096 {
            uses.retain(|_, u| now - *u < LAST_USED_GRANULARITY_MS);
        }
        uses.insert(id.to_string(), now);
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let cp = cp.clone();
    let id = id.to_string();
    runtime.spawn_blocking(move || {
        if let Err(e) = cp.store.touch_api_token(&id, now) {
            tracing::warn!(token = %id, error = %e, "could not record the token's last use");
        }
    });
}

fn invalid(field: &str, value: String, rule: &str) -> ServerError {
    ApiError::Invalid(vec![FieldError {
        field: field.to_string(),
        value,
        rule: rule.to_string(),
    }])
    .into()
}

/// Makes a token; the answer holds the secret, which is never stored.
pub fn create(cp: &ControlPlane, req: &TokenCreateRequest) -> Result<TokenCreated> {
    let description = req.description.trim();
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(invalid(
            "description",
            format!("{} characters", description.chars().count()),
            &format!("must be at most {MAX_DESCRIPTION_CHARS} characters"),
        ));
    }
    if description.chars().any(char::is_control) {
        return Err(invalid(
            "description",
            format!("{description:?}"),
            "must be one line without control characters",
        ));
    }
    let expires_ms = match req.ttl_seconds {
        None => None,
        Some(s) if s == 0 || s > MAX_TTL_SECONDS => {
            return Err(invalid(
                "ttlSeconds",
                s.to_string(),
                &format!("must be in [1, {MAX_TTL_SECONDS}] (ten years); leave it out for a token that lasts until revoked"),
            ))
        }
        Some(s) => Some(now_ms() + (s as i64) * 1000),
    };
    let secret = pki::random_hex(32)?;
    let record = cp.store.add_api_token(
        &new_id()?,
        &pki::token_hash(&secret),
        req.role,
        description,
        expires_ms,
    )?;
    tracing::info!(token = %record.id, role = %record.role, "API token created");
    Ok(TokenCreated {
        token: view(&record, None),
        secret,
    })
}

/// Every token not revoked; `current` marks the caller's.
pub fn list(cp: &ControlPlane, current: Option<&str>) -> Result<Vec<ApiTokenView>> {
    Ok(cp
        .store
        .api_tokens()?
        .iter()
        .map(|t| view(t, current))
        .collect())
}

/// Revokes a token: every request with it is refused from now on, and
/// console sessions signed in with it end.
pub fn revoke(cp: &ControlPlane, id: &str) -> Result<TokenRevoked> {
    let revoked_ms = cp.store.revoke_api_token(id, now_ms())?;
    tracing::info!(token = %id, "API token revoked");
    Ok(TokenRevoked {
        id: id.to_string(),
        revoked_ms,
    })
}

/// Whether `role` may do what needs `needs`; else the refusal naming both.
pub fn require(token: &ApiTokenRecord, needs: TokenRole, what: &str) -> Result<()> {
    if token.role >= needs {
        return Ok(());
    }
    Err(ServerError::InsufficientRole {
        what: what.to_string(),
        id: token.id.clone(),
        role: token.role,
        needs,
    })
}
