//! knit's own PostgreSQL role: it owns knit's database and nothing more
//! (LOGIN; no SUPERUSER, CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS),
//! set up by an administrative role that the servers never use. The
//! password is sent as a SCRAM-SHA-256 verifier computed here (by
//! postgres-protocol, tokio-postgres's own), so the clear password is in
//! no statement PostgreSQL could log.

use crate::{Db, DbError};

/// Whether `name` is a plain lower-case SQL identifier (so it needs no
/// quoting and cannot break out of a statement).
fn plain_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && name.len() <= 63
}

fn check(what: &str, name: &str) -> Result<(), DbError> {
    if plain_identifier(name) {
        Ok(())
    } else {
        Err(DbError::BadDatastore {
            value: name.to_string(),
            rule: format!(
                "{what} name must be a lower-case identifier (a-z, 0-9, _; at most 63 characters)"
            ),
        })
    }
}

/// A SCRAM-SHA-256 verifier of `password`, which `PASSWORD '…'` takes in
/// place of the clear password. It is base64 and `$`, `:`, `=` only: no
/// quote to escape.
#[cfg(feature = "postgres")]
pub fn scram_verifier(password: &str) -> Result<String, DbError> {
    Ok(postgres_protocol::password::scram_sha_256(
        password.as_bytes(),
    ))
}

/// Without PostgreSQL no role is ever made.
#[cfg(not(feature = "postgres"))]
pub fn scram_verifier(_password: &str) -> Result<String, DbError> {
    Err(DbError::not_built_in())
}

/// Makes `role` (or brings an existing one to) a login role with
/// `password` and no administrative attribute, and the owner of
/// `database` (created when missing), which other roles may not connect
/// to. `admin` is a connection of a role allowed to do that (a superuser),
/// to any database of the server.
pub fn ensure_owner(admin: &Db, role: &str, password: &str, database: &str) -> Result<(), DbError> {
    check("role", role)?;
    check("database", database)?;
    let verifier = scram_verifier(password)?;
    let attributes = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT";
    if role_exists(admin, role)? {
        admin.autocommit(&format!(
            "ALTER ROLE {role} WITH {attributes} PASSWORD '{verifier}'"
        ))?;
    } else {
        admin.autocommit(&format!(
            "CREATE ROLE {role} WITH {attributes} PASSWORD '{verifier}'"
        ))?;
    }
    let db_exists = admin
        .read(|tx| {
            tx.query_opt(
                "SELECT 1 FROM pg_database WHERE datname = ?1",
                crate::params![database],
            )
        })?
        .is_some();
    if db_exists {
        admin.autocommit(&format!("ALTER DATABASE {database} OWNER TO {role}"))?;
    } else {
        admin.autocommit(&format!("CREATE DATABASE {database} OWNER {role}"))?;
    }
    admin.autocommit(&format!("REVOKE ALL ON DATABASE {database} FROM PUBLIC"))?;
    Ok(())
}

/// Makes `role` a superuser that logs in with `password` (the
/// administrative role that sets knit's up), unless it exists. `by` is a
/// superuser's connection.
pub fn ensure_admin(by: &Db, role: &str, password: &str) -> Result<bool, DbError> {
    check("role", role)?;
    if role_exists(by, role)? {
        return Ok(false);
    }
    let verifier = scram_verifier(password)?;
    by.autocommit(&format!(
        "CREATE ROLE {role} WITH LOGIN SUPERUSER PASSWORD '{verifier}'"
    ))?;
    Ok(true)
}

/// When `role` is a superuser (an older knit ran as initdb's own role,
/// which can never lose SUPERUSER): renamed `to` and its login taken away,
/// so a plain `role` can be made in its place. Whether it was.
pub fn retire_superuser(admin: &Db, role: &str, to: &str) -> Result<bool, DbError> {
    check("role", role)?;
    check("role", to)?;
    let superuser = admin
        .read(|tx| {
            tx.query_opt(
                "SELECT rolsuper FROM pg_roles WHERE rolname = ?1",
                crate::params![role],
            )
        })?
        .map(|r| r.get::<bool>(0))
        .transpose()?
        .unwrap_or(false);
    if !superuser {
        return Ok(false);
    }
    admin.autocommit(&format!("ALTER ROLE {role} RENAME TO {to}"))?;
    admin.autocommit(&format!("ALTER ROLE {to} NOLOGIN"))?;
    Ok(true)
}

fn role_exists(db: &Db, role: &str) -> Result<bool, DbError> {
    Ok(db
        .read(|tx| {
            tx.query_opt(
                "SELECT 1 FROM pg_roles WHERE rolname = ?1",
                crate::params![role],
            )
        })?
        .is_some())
}

/// In `database` (which `admin_on_db` is connected to): every table,
/// sequence and view of schema `public`, and the schema itself, given to
/// `role` — a database whose tables another role made (an older knit that
/// ran as a superuser) becomes wholly `role`'s.
pub fn give_objects(admin_on_db: &Db, role: &str) -> Result<(), DbError> {
    check("role", role)?;
    let objects = admin_on_db.read(|tx| {
        tx.query(
            "SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' ELSE 'TABLE' END, c.relname \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S', 'v') \
             AND pg_get_userbyid(c.relowner) <> ?1",
            crate::params![role],
        )
    })?;
    for row in objects {
        let kind: String = row.get(0)?;
        let name: String = row.get(1)?;
        // Names come from the catalog: quoted as identifiers.
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        admin_on_db.autocommit(&format!("ALTER {kind} public.{quoted} OWNER TO {role}"))?;
    }
    let schema_owner: String = admin_on_db.read(|tx| {
        tx.query_one(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'public'",
            &[],
        )?
        .get(0)
    })?;
    // PostgreSQL 15 and later: `pg_database_owner`, which is `role` already.
    if schema_owner != role && schema_owner != "pg_database_owner" {
        admin_on_db.autocommit(&format!("ALTER SCHEMA public OWNER TO {role}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_are_taken() {
        for good in ["knit", "knit_admin", "_k2"] {
            assert!(plain_identifier(good), "{good}");
        }
        for bad in [
            "",
            "Knit",
            "1knit",
            "knit;drop",
            "a b",
            "k\"",
            &"a".repeat(64),
        ] {
            assert!(!plain_identifier(bad), "{bad}");
        }
        let e = check("role", "x;y").unwrap_err();
        assert_eq!(e.code(), "DB_BAD_DATASTORE");
        assert!(e.to_string().contains("role name"), "{e}");
    }
}
