//! The node's name, from the instance's name or the pool's rule.

use super::*;

/// The name the node will get must be a Kubernetes node name, checked here
/// so that a bad one is refused before anything is changed (automatic
/// mode re-images the machine; the agent would refuse the name after it).
pub(super) fn run(
    o: &mut Out,
    cluster: &Cluster,
    pool: &NodePool,
    i: &InstanceFacts,
    ctx: &Context,
) {
    const RULE: &str = "a node name must be a DNS-1123 subdomain: at most 253 characters, lowercase letters, digits, '-' and '.', every dot-separated part starting and ending with a letter or digit";
    if ctx.keep_instance_name {
        // What attach::node_name gives the node.
        let name = i.name.to_lowercase();
        let suggestion = dns_name_like(&name);
        o.require(
            NODE_NAME,
            knit_api::validate::is_dns_subdomain(&name),
            format!("node name {name:?} (the instance's name, lowercased)"),
            failure(
                format!(
                    "instance {}'s name {:?} cannot be its node name ({RULE}; upper case is lowercased): it holds {}",
                    i.id,
                    i.name,
                    offending(&name)
                ),
                match suggestion {
                    Some(s) => format!("rename the instance (e.g. to {s:?}), or add it without --keep-instance-name so that the pool's naming rule names the node"),
                    None => "rename the instance, or add it without --keep-instance-name so that the pool's naming rule names the node".to_string(),
                },
            ),
        );
        return;
    }
    let by_rule = knit_api::agent::node_name_by_rule(
        pool.spec.custom_node_name.as_ref(),
        i.ip.as_deref(),
        &cluster.spec.region,
        Some(&i.id),
    );
    let checked = match (&pool.spec.custom_node_name, &by_rule) {
        (Some(_), Some(name)) => knit_api::CustomNodeName::check_rendered(name),
        (None, Some(name)) if !knit_api::validate::is_dns_subdomain(name) => Err(RULE.to_string()),
        _ => Ok(()),
    };
    match (by_rule, checked) {
        (None, _) => o.pass(NODE_NAME, "named by the pool's rule once its address is known"),
        (Some(name), Ok(())) => o.pass(NODE_NAME, format!("node name {name:?} (the pool's rule)")),
        (Some(name), Err(rule)) => o.fail(
            NODE_NAME,
            failure(
                format!("the pool's naming rule names instance {}'s node {name:?}, which {rule}", i.id),
                "add it with --keep-instance-name (an instance name that is a valid node name), or change the pool's customNodeName",
            ),
        ),
    }
}

/// What in `name` breaks the node-name rule, in words.
fn offending(name: &str) -> String {
    let mut what: Vec<String> = Vec::new();
    let bad: Vec<char> = name
        .chars()
        .filter(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
        .collect();
    if bad.contains(&'_') {
        what.push("'_'".into());
    }
    if bad.iter().any(|c| c.is_whitespace()) {
        what.push("spaces".into());
    }
    if bad.iter().any(|c| !c.is_ascii()) {
        what.push("non-ASCII characters".into());
    }
    let others: String = bad
        .iter()
        .filter(|c| **c != '_' && !c.is_whitespace() && c.is_ascii())
        .collect();
    if !others.is_empty() {
        what.push(format!("{others:?}"));
    }
    if name.is_empty() {
        what.push("nothing (it is empty)".into());
    } else if name.len() > 253 {
        what.push(format!("{} characters", name.len()));
    }
    if what.is_empty() {
        what.push("a part that starts or ends with '-' or '.', or an empty part".into());
    }
    what.join(", ")
}

/// A node name close to `name` (other characters as '-'), if one is left.
fn dns_name_like(name: &str) -> Option<String> {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let parts: Vec<String> = mapped
        .split('.')
        .map(|p| {
            let mut squeezed = String::new();
            for c in p.chars() {
                if !(c == '-' && squeezed.ends_with('-')) {
                    squeezed.push(c);
                }
            }
            squeezed
                .trim_matches('-')
                .chars()
                .take(63)
                .collect::<String>()
        })
        .filter(|p| !p.is_empty())
        .collect();
    let out = parts.join(".");
    knit_api::validate::is_dns_subdomain(&out).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::tests::*;

    /// Issue 27 (2): with --keep-instance-name an instance name that is no
    /// node name ('_', spaces, non-ASCII) is refused by the preflight — so
    /// before the re-image — with the rule and how to fix it.
    #[test]
    fn a_kept_instance_name_must_be_a_node_name() {
        for (bad, like) in [
            ("web_01", "web-01"),
            ("web 01", "web-01"),
            ("wéb-01", "w-b-01"),
        ] {
            pair(
                "node-name",
                PreflightStatus::Error,
                "PreflightNodeNameInvalid",
                |_, _, i, ctx| {
                    ctx.keep_instance_name = true;
                    i.name = bad.into();
                },
            );
            let ctx = Context {
                keep_instance_name: true,
                ..Context::default()
            };
            let mut i = good();
            i.name = bad.into();
            let r = result(&terway(), &pool(), &i, &ctx, "node-name");
            assert!(r.message.contains("DNS-1123"), "{r:?}");
            assert!(r.fix.contains(&format!("{like:?}")), "a name to use: {r:?}");
            assert!(r.fix.contains("--keep-instance-name"), "{r:?}");
        }
        let ctx = Context {
            keep_instance_name: true,
            ..Context::default()
        };
        let mut i = good();
        i.name = "Web-01".into();
        let r = result(&terway(), &pool(), &i, &ctx, "node-name");
        assert_eq!(
            r.status,
            PreflightStatus::Pass,
            "upper case is lowercased: {r:?}"
        );
        assert!(r.message.contains("\"web-01\""), "{r:?}");
        // Without it, the pool's rule names the node: its name is checked.
        let mut v6 = good();
        v6.ip = Some("fd00::5".into());
        let mut p = pool();
        p.spec.custom_node_name = Some(knit_api::CustomNodeName {
            prefix: "node".into(),
            suffix: String::new(),
        });
        let r = result(&terway(), &p, &v6, &Context::default(), "node-name");
        assert_eq!(r.status, PreflightStatus::Error, "{r:?}");
        assert!(r.message.contains("IPv6"), "{r:?}");
    }
}
