//! Label and field selectors, as list and watch accept them.

use serde_json::Value;

use crate::error::ApiStatus;

#[derive(Debug, Clone, PartialEq)]
enum Term {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

#[derive(Debug, Clone, Default)]
pub struct Selector {
    labels: Vec<Term>,
    /// (dotted field path, value, equal?), e.g. `spec.nodeName=n1`.
    fields: Vec<(String, String, bool)>,
}

impl Selector {
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Selector, ApiStatus> {
        let mut s = Selector::default();
        if let Some(l) = labels.filter(|l| !l.trim().is_empty()) {
            for term in split_terms(l) {
                s.labels.push(parse_label_term(term.trim())?);
            }
        }
        if let Some(f) = fields.filter(|f| !f.trim().is_empty()) {
            for term in f.split(',') {
                let (key, value, eq) = if let Some((k, v)) = term.split_once("!=") {
                    (k, v, false)
                } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('='))
                {
                    (k, v, true)
                } else {
                    return Err(ApiStatus::bad_request(format!(
                        "invalid field selector term {term:?}"
                    )));
                };
                let key = key.trim();
                if key.is_empty() || key.split('.').any(str::is_empty) {
                    return Err(ApiStatus::bad_request(format!(
                        "invalid field selector term {term:?}"
                    )));
                }
                s.fields
                    .push((key.to_string(), value.trim().to_string(), eq));
            }
        }
        Ok(s)
    }

    /// Selects everything (no label or field term).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// The single name a field selector pins, if any (`metadata.name=x`).
    pub fn pinned_name(&self) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _, eq)| k == "metadata.name" && *eq)
            .map(|(_, v, _)| v.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|t| match t {
            Term::Eq(k, v) => label(k) == Some(v.as_str()),
            Term::Ne(k, v) => label(k) != Some(v.as_str()),
            Term::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Term::NotIn(k, vs) => label(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            Term::Exists(k) => label(k).is_some(),
            Term::Absent(k) => label(k).is_none(),
        });
        labels_ok
            && self.fields.iter().all(|(k, v, eq)| {
                // A missing field reads as empty, as `involvedObject.namespace=` expects.
                let actual = match k.split('.').try_fold(obj, |o, seg| o.get(seg)) {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                };
                (actual == *v) == *eq
            })
    }
}

/// Split on commas outside parentheses (`a in (x,y),b`).
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_label_term(t: &str) -> Result<Term, ApiStatus> {
    let bad = || ApiStatus::bad_request(format!("unable to parse requirement: {t:?}"));
    let set = |rest: &str| -> Result<Vec<String>, ApiStatus> {
        let inner = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(bad)?;
        Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
    };
    if let Some(k) = t.strip_prefix('!') {
        return Ok(Term::Absent(k.trim().to_string()));
    }
    if let Some((k, v)) = t.split_once("!=") {
        return Ok(Term::Ne(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
        return Ok(Term::Eq(k.trim().into(), v.trim().into()));
    }
    if let Some((k, rest)) = t.split_once(" notin ") {
        return Ok(Term::NotIn(k.trim().into(), set(rest)?));
    }
    if let Some((k, rest)) = t.split_once(" in ") {
        return Ok(Term::In(k.trim().into(), set(rest)?));
    }
    if t.is_empty() || t.contains(' ') {
        return Err(bad());
    }
    Ok(Term::Exists(t.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_and_field_terms() {
        let n = json!({"metadata": {"name": "a", "labels": {"pool": "p1", "zone": "z"}}});
        let ok = |l: &str, f: &str| Selector::parse(Some(l), Some(f)).unwrap().matches(&n);
        assert!(ok("pool=p1", ""));
        assert!(ok("pool in (p0,p1),zone", "metadata.name=a"));
        assert!(!ok("pool notin (p1)", ""));
        assert!(!ok("!zone", ""));
        assert!(!ok("", "metadata.name=b"));
        assert!(ok("pool!=p2", "metadata.name!=b"));
        assert_eq!(
            Selector::parse(None, Some("spec..x=1")).unwrap_err().code,
            400
        );
        assert_eq!(
            Selector::parse(None, Some("nonsense")).unwrap_err().code,
            400
        );
        // kubectl describe node: pods on the node, events about it.
        let pod = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let sel = Selector::parse(
            None,
            Some("spec.nodeName=n1,status.phase!=Failed,involvedObject.namespace="),
        )
        .unwrap();
        assert!(sel.matches(&pod));
        assert_eq!(
            Selector::parse(None, Some("metadata.name=a"))
                .unwrap()
                .pinned_name(),
            Some("a")
        );
    }
}
