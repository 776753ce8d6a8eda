//! `-l/--selector`: Kubernetes label selectors, as kubectl takes them.
//!
//! Requirements separated by commas, all of which must hold: `key=value`
//! (or `==`), `key!=value`, `key` (the label is set), `!key` (it is not),
//! `key in (a,b)`, `key notin (a,b)`. As in Kubernetes, `!=` and `notin`
//! also match an object without the label.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// A selector that cannot be read: the text and the rule.
#[derive(Debug, thiserror::Error)]
#[error("selector {selector:?}: {why} (forms: key=value, key!=value, key, !key, key in (a,b), key notin (a,b), joined by commas)")]
pub struct SelectorError {
    selector: String,
    why: String,
}

impl std::str::FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Selector, SelectorError> {
        let fail = |why: String| SelectorError {
            selector: s.to_string(),
            why,
        };
        let mut requirements = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                return Err(fail("an empty requirement".into()));
            }
            requirements.push(requirement(part).map_err(fail)?);
        }
        Ok(Selector { requirements })
    }
}

/// Splits at commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn key(k: &str) -> Result<String, String> {
    let k = k.trim();
    let ok = !k.is_empty()
        && k.len() <= 317
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if ok {
        Ok(k.to_string())
    } else {
        Err(format!("{k:?} is not a label key"))
    }
}

fn value(v: &str) -> Result<String, String> {
    let v = v.trim();
    let ok = v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!("{v:?} is not a label value"))
    }
}

fn set(rest: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("{:?} is not a set like (a,b)", rest.trim()))?;
    inner.split(',').map(value).collect()
}

fn requirement(part: &str) -> Result<Requirement, String> {
    if let Some(k) = part.strip_prefix('!') {
        return Ok(Requirement::Absent(key(k)?));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(Requirement::NotEquals(key(k)?, value(v)?));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(Requirement::Equals(key(k)?, value(v)?));
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let k = words.next().unwrap_or_default();
    match words.next().map(str::trim_start) {
        None => Ok(Requirement::Exists(key(k)?)),
        Some(rest) => {
            if let Some(s) = rest.strip_prefix("notin") {
                Ok(Requirement::NotIn(key(k)?, set(s)?))
            } else if let Some(s) = rest.strip_prefix("in") {
                Ok(Requirement::In(key(k)?, set(s)?))
            } else {
                Err(format!("{part:?} is not a requirement"))
            }
        }
    }
}

impl Selector {
    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::Absent(k) => !labels.contains_key(k),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_form() {
        let web = labels(&[("tier", "web"), ("knit.dev/pool", "workers")]);
        let db = labels(&[("tier", "db")]);
        let none = labels(&[]);
        let cases: &[(&str, [bool; 3])] = &[
            ("tier=web", [true, false, false]),
            ("tier==web", [true, false, false]),
            ("tier!=web", [false, true, true]),
            ("tier", [true, true, false]),
            ("!tier", [false, false, true]),
            ("tier in (web, db)", [true, true, false]),
            ("tier notin (web)", [false, true, true]),
            ("tier,knit.dev/pool=workers", [true, false, false]),
            ("tier in (db,web),!knit.dev/pool", [false, true, false]),
        ];
        for (s, want) in cases {
            let sel: Selector = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            let got = [sel.matches(&web), sel.matches(&db), sel.matches(&none)];
            assert_eq!(&got, want, "{s}");
        }
    }

    #[test]
    fn bad_selectors_say_why() {
        for s in ["", "tier=", "tier in web", "a b c", "ti er=x", "x=a b"] {
            let e = s.parse::<Selector>();
            if s == "tier=" {
                // An empty value is a value (the label set to "").
                assert!(e.is_ok(), "{s}");
                continue;
            }
            let e = e.expect_err(s).to_string();
            assert!(e.contains("forms: key=value"), "{s}: {e}");
        }
    }
}
