//! A small line template for configuration files (haproxy.cfg): `{{name}}`
//! is replaced by a word, `{{#each list}}` … `{{/each}}` (each on a line of
//! its own) repeats the lines between for every item of a list, and a line
//! opening with `{{!` is a comment left out. Every word is checked against
//! the caller's rule before it is written, so a value cannot add a line, a
//! directive or a comment to the file: there is nothing to escape.

use std::collections::BTreeMap;

/// What a name stands for: one word, or a list of items (each a scope of
/// its own, inside the scopes around it).
pub(super) enum Value {
    Word(String),
    List(Vec<Scope>),
}

pub(super) type Scope = BTreeMap<&'static str, Value>;

/// Why a template could not be filled.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TemplateError {
    /// A word broke the rule: the name it fills, its value and the rule.
    Word {
        name: String,
        value: String,
        rule: &'static str,
    },
    /// The template itself is wrong (a name without a value, an unclosed
    /// `{{#each}}` …): a bug in the program, named with the line.
    Template { line: usize, message: String },
}

impl std::fmt::Display for TemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateError::Word { name, value, rule } => write!(f, "{name} {value:?} {rule}"),
            TemplateError::Template { line, message } => {
                write!(f, "template line {line}: {message}")
            }
        }
    }
}

/// Fills `template` from `scope`; `allowed` is the rule every word must
/// pass (`Err(rule)` names it).
pub(super) fn render(
    template: &str,
    scope: &Scope,
    allowed: fn(&str) -> Result<(), &'static str>,
) -> Result<String, TemplateError> {
    let lines: Vec<&str> = template.lines().collect();
    let mut out = String::new();
    let end = block(&lines, 0, &mut vec![scope], allowed, &mut out)?;
    if end < lines.len() {
        return Err(TemplateError::Template {
            line: end + 1,
            message: "{{/each}} without {{#each}}".into(),
        });
    }
    Ok(out)
}

/// Renders lines from `start` to the end or the first `{{/each}}` at this
/// level (returned: its index, or `lines.len()`).
fn block<'a>(
    lines: &[&str],
    start: usize,
    scopes: &mut Vec<&'a Scope>,
    allowed: fn(&str) -> Result<(), &'static str>,
    out: &mut String,
) -> Result<usize, TemplateError> {
    let mut i = start;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim();
        if line.starts_with("{{!") {
            i += 1;
        } else if trimmed == "{{/each}}" {
            return Ok(i);
        } else if let Some(name) = trimmed
            .strip_prefix("{{#each ")
            .and_then(|r| r.strip_suffix("}}"))
        {
            let bad = |message: String| TemplateError::Template {
                line: i + 1,
                message,
            };
            let items = match lookup(scopes, name) {
                Some(Value::List(items)) => items,
                Some(Value::Word(_)) => return Err(bad(format!("{name} is a word, not a list"))),
                None => return Err(bad(format!("no list {name}"))),
            };
            let end =
                skip(lines, i + 1).ok_or_else(|| bad("{{#each}} without {{/each}}".into()))?;
            for item in items {
                scopes.push(item);
                block(lines, i + 1, scopes, allowed, out)?;
                scopes.pop();
            }
            i = end + 1;
        } else {
            fill(line, i + 1, scopes, allowed, out)?;
            out.push('\n');
            i += 1;
        }
    }
    Ok(i)
}

/// The index of the `{{/each}}` closing the block that starts at `start`.
fn skip(lines: &[&str], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, l) in lines.iter().enumerate().skip(start) {
        let t = l.trim();
        if l.starts_with("{{!") {
            continue;
        }
        if t.starts_with("{{#each ") {
            depth += 1;
        } else if t == "{{/each}}" {
            if depth == 0 {
                return Some(k);
            }
            depth -= 1;
        }
    }
    None
}

fn lookup<'a>(scopes: &[&'a Scope], name: &str) -> Option<&'a Value> {
    scopes.iter().rev().find_map(|s| s.get(name))
}

/// One line with its `{{name}}`s replaced by their checked words.
fn fill(
    line: &str,
    number: usize,
    scopes: &[&Scope],
    allowed: fn(&str) -> Result<(), &'static str>,
    out: &mut String,
) -> Result<(), TemplateError> {
    let bad = |message: String| TemplateError::Template {
        line: number,
        message,
    };
    let mut rest = line;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| bad("{{ without }}".into()))?;
        let name = &after[..close];
        let word = match lookup(scopes, name) {
            Some(Value::Word(w)) => w,
            Some(Value::List(_)) => return Err(bad(format!("{name} is a list, not a word"))),
            None => return Err(bad(format!("no value for {{{{{name}}}}}"))),
        };
        allowed(word).map_err(|rule| TemplateError::Word {
            name: name.to_string(),
            value: word.clone(),
            rule,
        })?;
        out.push_str(word);
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(_: &str) -> Result<(), &'static str> {
        Ok(())
    }

    fn digits(v: &str) -> Result<(), &'static str> {
        if v.chars().all(|c| c.is_ascii_digit()) {
            Ok(())
        } else {
            Err("must be digits")
        }
    }

    fn w(s: &str) -> Value {
        Value::Word(s.into())
    }

    #[test]
    fn lists_repeat_nest_and_see_the_scopes_around_them() {
        let scope = Scope::from([
            ("title", w("t")),
            (
                "outer",
                Value::List(vec![
                    Scope::from([
                        ("name", w("a")),
                        (
                            "inner",
                            Value::List(vec![
                                Scope::from([("x", w("1"))]),
                                Scope::from([("x", w("2"))]),
                            ]),
                        ),
                    ]),
                    Scope::from([("name", w("b")), ("inner", Value::List(vec![]))]),
                ]),
            ),
        ]);
        let t = "{{! a comment, left out\n# {{title}}\n{{#each outer}}\n[{{name}}]\n{{#each inner}}\n  {{name}}.{{x}} of {{title}}\n{{/each}}\nend {{name}}\n{{/each}}\ndone\n";
        assert_eq!(
            render(t, &scope, any).unwrap(),
            "# t\n[a]\n  a.1 of t\n  a.2 of t\nend a\n[b]\nend b\ndone\n"
        );
    }

    #[test]
    fn a_word_breaking_the_rule_is_refused_with_name_value_and_rule() {
        let scope = Scope::from([("n", w("12x"))]);
        let e = render("port {{n}}\n", &scope, digits).unwrap_err();
        assert_eq!(
            e,
            TemplateError::Word {
                name: "n".into(),
                value: "12x".into(),
                rule: "must be digits"
            }
        );
        assert_eq!(e.to_string(), "n \"12x\" must be digits");
    }

    #[test]
    fn a_broken_template_is_an_error_naming_its_line() {
        let scope = Scope::from([("w", w("1")), ("l", Value::List(vec![]))]);
        for (t, line, what) in [
            ("a\n{{missing}}\n", 2, "no value for {{missing}}"),
            ("{{w\n", 1, "{{ without }}"),
            ("{{#each l}}\nx\n", 1, "{{#each}} without {{/each}}"),
            ("x\n{{/each}}\n", 2, "{{/each}} without {{#each}}"),
            ("{{#each w}}\n{{/each}}\n", 1, "w is a word, not a list"),
            ("{{#each nope}}\n{{/each}}\n", 1, "no list nope"),
            ("{{l}}\n", 1, "l is a list, not a word"),
        ] {
            match render(t, &scope, any) {
                Err(TemplateError::Template { line: l, message }) => {
                    assert_eq!((l, message.as_str()), (line, what), "{t:?}")
                }
                other => panic!("{t:?}: {other:?}"),
            }
        }
    }
}
