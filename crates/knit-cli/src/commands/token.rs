//! `knit token create|list|revoke`: API tokens with a role (viewer,
//! operator, admin). The secret is printed once, at create; the server
//! keeps only its hash.

use super::now_ms;
use crate::error::Result;
use crate::output::{age, cell, table};
use clap::{Subcommand, ValueEnum};
use knit_api::state::TokenRole;
use knit_api::views::{ApiTokenView, TokenCreateRequest};
use knit_client::Client;
use std::process::ExitCode;

/// `--role`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Reads everything, `/metrics` and the console included.
    Viewer,
    /// Also changes pools, scales, attaches, snapshots, rollouts, removes nodes.
    Operator,
    /// Also runs `knit exec`, reads node logs and manages tokens.
    Admin,
}

impl From<Role> for TokenRole {
    fn from(r: Role) -> TokenRole {
        match r {
            Role::Viewer => TokenRole::Viewer,
            Role::Operator => TokenRole::Operator,
            Role::Admin => TokenRole::Admin,
        }
    }
}

/// `-o` of `token list`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ListFormat {
    Json,
}

#[derive(Subcommand)]
pub enum TokenAction {
    /// Make a token and print its secret (shown this once; the server keeps
    /// only its hash). Needs an admin token.
    Create {
        #[arg(long, value_enum)]
        role: Role,
        /// How long it works (`24h`, `90m`, `30d`, or seconds); default:
        /// until revoked.
        #[arg(long, value_parser = super::seconds)]
        ttl: Option<u64>,
        /// A note saying who or what holds it.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// The tokens: id, role, description, created, expires, last used
    /// (never a secret). `*` marks the one this client uses.
    List {
        #[arg(short = 'o', long, value_enum)]
        output: Option<ListFormat>,
    },
    /// Revoke a token at once (requests and console sessions with it are
    /// refused from then on); the last admin token is refused.
    Revoke { id: String },
}

pub fn run(c: &Client, action: TokenAction) -> Result<ExitCode> {
    match action {
        TokenAction::Create {
            role,
            ttl,
            description,
        } => {
            let made = c.create_token(&TokenCreateRequest {
                role: role.into(),
                ttl_seconds: ttl,
                description,
            })?;
            let t = &made.token;
            // The secret alone on stdout (`TOKEN=$(knit token create …)`);
            // what it is on stderr.
            eprintln!(
                "token {} (role {}, expires {}): the secret below is shown only now",
                t.id,
                t.role,
                t.expires_ms
                    .map_or_else(|| "never".to_string(), |e| in_time(e, now_ms()))
            );
            println!("{}", made.secret);
            Ok(ExitCode::SUCCESS)
        }
        TokenAction::List { output } => {
            let docs = c.list_tokens()?;
            if output == Some(ListFormat::Json) {
                let raw: Vec<&serde_json::Value> = docs.iter().map(|d| &d.raw).collect();
                print!(
                    "{}",
                    crate::output::json(&serde_json::json!({ "items": raw }))
                );
                return Ok(ExitCode::SUCCESS);
            }
            let views: Vec<&ApiTokenView> = docs.iter().map(|d| &d.view).collect();
            print!("{}", token_table(&views, now_ms()));
            Ok(ExitCode::SUCCESS)
        }
        TokenAction::Revoke { id } => {
            c.revoke_token(&id)?;
            println!("token/{id} revoked");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// How far ahead `at` is: `in 23h`, or `expired` when past.
fn in_time(at: i64, now: i64) -> String {
    if at <= now {
        "expired".to_string()
    } else {
        format!("in {}", age(now, at))
    }
}

pub fn token_table(items: &[&ApiTokenView], now: i64) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            vec![
                format!("{}{}", t.id, if t.current { " *" } else { "" }),
                t.role.to_string(),
                cell(&t.description),
                age(t.created_ms, now),
                t.expires_ms
                    .map_or_else(|| "never".to_string(), |e| in_time(e, now)),
                t.last_used_ms
                    .map_or_else(|| "never".to_string(), |u| format!("{} ago", age(u, now))),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "ROLE",
            "DESCRIPTION",
            "CREATED",
            "EXPIRES",
            "LAST USED",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_every_column_and_no_secret() {
        let now = 10 * 86_400_000;
        let t = ApiTokenView {
            id: "tok-0123456789ab".into(),
            role: TokenRole::Operator,
            description: "ci".into(),
            created_ms: now - 3_600_000,
            expires_ms: Some(now + 86_400_000),
            last_used_ms: Some(now - 120_000),
            current: true,
        };
        let expired = ApiTokenView {
            id: "tok-ffffffffffff".into(),
            expires_ms: Some(now - 1),
            last_used_ms: None,
            current: false,
            description: String::new(),
            ..t.clone()
        };
        let out = token_table(&[&t, &expired], now);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("ID"), "{out}");
        for want in [
            "tok-0123456789ab *",
            "operator",
            "ci",
            "60m",
            "in 24h",
            "2m ago",
        ] {
            assert!(lines[1].contains(want), "{want} in {out}");
        }
        for want in ["expired", "never", "<none>"] {
            assert!(lines[2].contains(want), "{want} in {out}");
        }
    }
}
