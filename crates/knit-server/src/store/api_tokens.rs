//! API tokens: the bearer credentials of the REST API, the console and
//! `/metrics`, each with a role (`TokenRole`). Only the SHA-256 of a
//! secret is stored. A revoked token's row stays (its `revoked_ms` set) so
//! that the admin token file of the first start is never seeded again.

use super::{now_ms, word, Store};
use crate::error::{Result, ServerError};
use knit_api::state::TokenRole;
use knit_db::{params, Row};

/// The table of this module (one migration step).
pub const SCHEMA: &str = r#"
CREATE TABLE api_tokens (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    last_used_ms INTEGER,
    revoked_ms INTEGER
);
"#;

/// How often a token's `last_used_ms` is written at most: a busy client
/// costs one write a minute, not one per request.
pub const LAST_USED_GRANULARITY_MS: i64 = 60_000;

/// One token as stored (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTokenRecord {
    pub id: String,
    pub role: TokenRole,
    pub description: String,
    pub created_ms: i64,
    pub expires_ms: Option<i64>,
    pub last_used_ms: Option<i64>,
    pub revoked_ms: Option<i64>,
}

impl ApiTokenRecord {
    /// Neither revoked nor past its expiry at `now`.
    pub fn is_live(&self, now: i64) -> bool {
        self.revoked_ms.is_none() && self.expires_ms.is_none_or(|e| e > now)
    }
}

/// What a presented secret is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenCheck {
    Live(ApiTokenRecord),
    Unknown,
    Revoked { id: String, revoked_ms: i64 },
    Expired { id: String, expires_ms: i64 },
}

const COLUMNS: &str = "id, role, description, created_ms, expires_ms, last_used_ms, revoked_ms";

fn record(r: &Row) -> Result<ApiTokenRecord> {
    Ok(ApiTokenRecord {
        id: r.get(0)?,
        role: word(r, 1)?,
        description: r.get(2)?,
        created_ms: r.get(3)?,
        expires_ms: r.get(4)?,
        last_used_ms: r.get(5)?,
        revoked_ms: r.get(6)?,
    })
}

impl Store {
    /// A new token (`id` and the secret's `token_hash` made by the caller).
    pub fn add_api_token(
        &self,
        id: &str,
        token_hash: &str,
        role: TokenRole,
        description: &str,
        expires_ms: Option<i64>,
    ) -> Result<ApiTokenRecord> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO api_tokens (id, token_hash, role, description, created_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![id, token_hash, role.as_str(), description, now, expires_ms],
            )?;
            Ok(())
        })?;
        Ok(ApiTokenRecord {
            id: id.to_string(),
            role,
            description: description.to_string(),
            created_ms: now,
            expires_ms,
            last_used_ms: None,
            revoked_ms: None,
        })
    }

    /// The first admin token: the server's admin token file, stored as an
    /// admin token when the table has never held one (the first start, or
    /// the first start of a knit that has this table). Never again after:
    /// a revoked first token stays revoked. `Some(id)` when it was stored.
    pub fn seed_first_admin_token(&self, id: &str, token_hash: &str) -> Result<Option<String>> {
        let now = now_ms();
        self.write(|tx| {
            let any = tx.query_opt("SELECT id FROM api_tokens LIMIT 1", &[])?;
            if any.is_some() {
                return Ok(None);
            }
            tx.execute(
                "INSERT INTO api_tokens (id, token_hash, role, description, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    id,
                    token_hash,
                    TokenRole::Admin.as_str(),
                    "the first admin token (the server's admin-token file)",
                    now
                ],
            )?;
            Ok(Some(id.to_string()))
        })
    }

    /// What the secret whose hash is `token_hash` is at `now`.
    pub fn check_api_token(&self, token_hash: &str, now: i64) -> Result<TokenCheck> {
        let found = self.read(|tx| {
            tx.query_opt(
                &format!("SELECT {COLUMNS} FROM api_tokens WHERE token_hash = ?1"),
                params![token_hash],
            )?
            .map(|r| record(&r))
            .transpose()
        })?;
        Ok(match found {
            None => TokenCheck::Unknown,
            Some(t) => match (t.revoked_ms, t.expires_ms) {
                (Some(revoked_ms), _) => TokenCheck::Revoked {
                    id: t.id,
                    revoked_ms,
                },
                (None, Some(expires_ms)) if expires_ms <= now => TokenCheck::Expired {
                    id: t.id,
                    expires_ms,
                },
                _ => TokenCheck::Live(t),
            },
        })
    }

    pub fn api_token(&self, id: &str) -> Result<Option<ApiTokenRecord>> {
        self.read(|tx| {
            tx.query_opt(
                &format!("SELECT {COLUMNS} FROM api_tokens WHERE id = ?1"),
                params![id],
            )?
            .map(|r| record(&r))
            .transpose()
        })
    }

    /// Every token not revoked (expired ones included), oldest first.
    pub fn api_tokens(&self) -> Result<Vec<ApiTokenRecord>> {
        let mut rows = self.read(|tx| {
            tx.query(
                &format!("SELECT {COLUMNS} FROM api_tokens WHERE revoked_ms IS NULL"),
                &[],
            )?
            .iter()
            .map(record)
            .collect::<Result<Vec<_>>>()
        })?;
        rows.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        Ok(rows)
    }

    /// Revokes a token, at once and for good. The last live admin token
    /// is refused (`LastAdminToken`): nobody could make another or manage
    /// tokens after it. Answers when it was revoked (the first time, when
    /// it already was).
    pub fn revoke_api_token(&self, id: &str, now: i64) -> Result<i64> {
        self.write(|tx| {
            let row = tx
                .query_opt(
                    &format!("SELECT {COLUMNS} FROM api_tokens WHERE id = ?1"),
                    params![id],
                )?
                .map(|r| record(&r))
                .transpose()?;
            let Some(token) = row else {
                return Err(ServerError::NotFound {
                    kind: "token",
                    name: id.to_string(),
                });
            };
            if let Some(at) = token.revoked_ms {
                return Ok(at);
            }
            if token.role == TokenRole::Admin && token.is_live(now) {
                let others: i64 = tx
                    .query_one(
                        "SELECT COUNT(*) FROM api_tokens WHERE role = ?1 AND id <> ?2 AND revoked_ms IS NULL AND (expires_ms IS NULL OR expires_ms > ?3)",
                        params![TokenRole::Admin.as_str(), id, now],
                    )?
                    .get(0)?;
                if others == 0 {
                    return Err(ServerError::LastAdminToken { id: id.to_string() });
                }
            }
            tx.execute(
                "UPDATE api_tokens SET revoked_ms = ?2 WHERE id = ?1",
                params![id, now],
            )?;
            Ok(now)
        })
    }

    /// Records a use of the token at `now`, unless one was recorded less
    /// than [`LAST_USED_GRANULARITY_MS`] ago. `true` when it wrote.
    pub fn touch_api_token(&self, id: &str, now: i64) -> Result<bool> {
        self.write(|tx| {
            let changed = tx.execute(
                "UPDATE api_tokens SET last_used_ms = ?2 WHERE id = ?1 AND (last_used_ms IS NULL OR last_used_ms <= ?3)",
                params![id, now, now - LAST_USED_GRANULARITY_MS],
            )?;
            Ok(changed > 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_live_until_revoked_or_expired() {
        crate::store::testing::each_store(|store| {
            let now = now_ms();
            store
                .add_api_token("tok-a", "ha", TokenRole::Viewer, "ci", None)
                .unwrap();
            store
                .add_api_token("tok-b", "hb", TokenRole::Operator, "", Some(now - 1))
                .unwrap();
            match store.check_api_token("ha", now).unwrap() {
                TokenCheck::Live(t) => {
                    assert_eq!((t.id.as_str(), t.role), ("tok-a", TokenRole::Viewer));
                    assert_eq!(t.description, "ci");
                }
                other => panic!("{other:?}"),
            }
            assert!(matches!(
                store.check_api_token("hb", now).unwrap(),
                TokenCheck::Expired { .. }
            ));
            assert_eq!(
                store.check_api_token("nope", now).unwrap(),
                TokenCheck::Unknown
            );
            store.revoke_api_token("tok-a", now).unwrap();
            assert!(matches!(
                store.check_api_token("ha", now).unwrap(),
                TokenCheck::Revoked { .. }
            ));
            // Listed: the expired one, not the revoked one.
            let ids: Vec<String> = store
                .api_tokens()
                .unwrap()
                .into_iter()
                .map(|t| t.id)
                .collect();
            assert_eq!(ids, vec!["tok-b".to_string()]);
            let err = store.revoke_api_token("tok-zzz", now).unwrap_err();
            assert_eq!(err.code(), "NotFound");
        });
    }

    /// The first admin token is stored once: never again once the table
    /// holds any token, so a revoked first token stays revoked.
    #[test]
    fn the_first_admin_token_is_seeded_once_and_the_last_admin_stays() {
        crate::store::testing::each_store(|store| {
            let now = now_ms();
            assert_eq!(
                store.seed_first_admin_token("tok-first", "hf").unwrap(),
                Some("tok-first".to_string())
            );
            assert_eq!(
                store.seed_first_admin_token("tok-again", "hf").unwrap(),
                None
            );
            // The only admin: refused, with the stable code.
            let err = store.revoke_api_token("tok-first", now).unwrap_err();
            assert_eq!((err.code(), err.http_status()), ("LastAdminToken", 409));
            // An expired admin does not count as another.
            store
                .add_api_token("tok-old", "ho", TokenRole::Admin, "", Some(now - 1))
                .unwrap();
            assert!(store.revoke_api_token("tok-first", now).is_err());
            store
                .add_api_token("tok-second", "hs", TokenRole::Admin, "", None)
                .unwrap();
            store.revoke_api_token("tok-first", now).unwrap();
            assert!(matches!(
                store.check_api_token("hf", now).unwrap(),
                TokenCheck::Revoked { .. }
            ));
            assert_eq!(
                store.seed_first_admin_token("tok-third", "hf").unwrap(),
                None
            );
            let err = store.revoke_api_token("tok-second", now).unwrap_err();
            assert_eq!(err.code(), "LastAdminToken");
        });
    }

    #[test]
    fn last_used_is_written_at_most_once_a_minute() {
        crate::store::testing::each_store(|store| {
            store
                .add_api_token("tok-u", "hu", TokenRole::Viewer, "", None)
                .unwrap();
            let now = now_ms();
            assert!(store.touch_api_token("tok-u", now).unwrap());
            assert!(!store.touch_api_token("tok-u", now + 1_000).unwrap());
            assert_eq!(
                store.api_token("tok-u").unwrap().unwrap().last_used_ms,
                Some(now)
            );
            assert!(store
                .touch_api_token("tok-u", now + LAST_USED_GRANULARITY_MS)
                .unwrap());
        });
    }
}
