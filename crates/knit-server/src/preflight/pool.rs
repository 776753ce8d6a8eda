//! The pool takes added instances: its type, and a new password when the
//! re-image drops the old one.

use super::*;

pub(super) fn run(o: &mut Out, pool: &NodePool, i: &InstanceFacts, ctx: &Context) {
    let ps = &pool.spec;
    let pool_name = &pool.metadata.name;

    // Pool type.
    o.require(
        POOL_NOT_AUTO_MODE,
        ps.pool_type != "auto-mode",
        format!("pool type {}", ps.pool_type),
        failure(
            format!("pool {pool_name:?} is an auto-mode pool: its nodes are managed for you"),
            "add the instance to a regular pool",
        ),
    );
    o.require(
        POOL_NO_AUTO_SCALING,
        ps.pool_type != "auto-scaling",
        "no auto-scaling",
        failure(
            format!(
                "pool {pool_name:?} has auto-scaling: the autoscaler would remove added instances"
            ),
            "add the instance to a pool without auto-scaling",
        ),
    );

    // Login: automatic mode resets the system disk, so a password pool needs a new password.
    let password_lost = ctx.mode == Mode::Automatic
        && (ps.login.password.is_some() || i.password_login)
        && !ctx.new_password;
    o.require(
        NEW_PASSWORD,
        !password_lost,
        "no new password needed, or one given",
        failure(
            "the instance is re-imaged and logs in by password: a new password is required",
            "give --password with the new login password",
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::tests::*;

    #[test]
    fn pool_type() {
        pair(
            "pool-not-auto-mode",
            PreflightStatus::Error,
            "PreflightAutoModePool",
            |_, p, _, _| p.spec.pool_type = "auto-mode".into(),
        );
        pair(
            "pool-no-auto-scaling",
            PreflightStatus::Error,
            "PreflightAutoScalingPool",
            |_, p, _, _| p.spec.pool_type = "auto-scaling".into(),
        );
    }
    #[test]
    fn new_password() {
        pair(
            "new-password",
            PreflightStatus::Error,
            "PreflightPasswordRequired",
            |_, p, _, _| p.spec.login.password = Some("Secret-123".into()),
        );
        let mut p = pool();
        p.spec.login.password = Some("Secret-123".into());
        let ctx = Context {
            new_password: true,
            ..Context::default()
        };
        assert_eq!(
            result(&terway(), &p, &good(), &ctx, "new-password").status,
            PreflightStatus::Pass
        );
    }
}
