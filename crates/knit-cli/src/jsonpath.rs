//! `-o jsonpath=TEMPLATE`: kubectl's JSONPath templates.
//!
//! A template is text with `{…}` actions, as kubectl takes them:
//!
//! - `{.items[*].metadata.name}`: a path, relative to the current object
//!   (the document at the top, the element inside a `range`); `{$…}` is
//!   relative to the document, `{@…}` to the current object. Several
//!   results are printed separated by spaces; a string as it is, anything
//!   else as JSON.
//! - `{range .items[*]}…{end}`: the text between, once per result.
//! - `{"\n"}`, `{'\t'}`: a quoted literal, with `\n`, `\t`, `\r`, `\\`,
//!   `\"` and `\'` escapes.
//! - A template without any `{` is taken as one path (`.metadata.name`).
//!
//! Paths are evaluated by `serde_json_path` (RFC 9535 JSONPath): child
//! names, `[N]`, `[*]`, `..`, slices `[a:b]`, unions and filters
//! (`[?(@.status.ready > 0)]`, `[?@.kind == 'NodePool']`) work as in
//! kubectl. Not supported: kubectl's `{.items[*]['a', 'b']}` output
//! quirks for maps, and filter functions beyond RFC 9535's.

use serde_json::Value;
use serde_json_path::JsonPath;

/// A template that cannot be read, with where and why.
#[derive(Debug, thiserror::Error)]
#[error("jsonpath template {template:?}: {why}")]
pub struct TemplateError {
    template: String,
    why: String,
}

#[derive(Debug)]
enum Node {
    Text(String),
    Path(JsonPath, bool),
    Range(JsonPath, bool, Vec<Node>),
}

/// One level of the parse: the nodes so far and, inside a range, its
/// path (and whether it is relative).
type Level = (Vec<Node>, Option<(JsonPath, bool)>);

/// A parsed template.
#[derive(Debug)]
pub struct Template {
    nodes: Vec<Node>,
}

impl Template {
    pub fn parse(template: &str) -> Result<Template, TemplateError> {
        let fail = |why: String| TemplateError {
            template: template.to_string(),
            why,
        };
        let source = if template.contains('{') {
            template.to_string()
        } else {
            format!("{{{template}}}")
        };
        let mut stack: Vec<Level> = vec![(Vec::new(), None)];
        let mut rest = source.as_str();
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                push(&mut stack, Node::Text(rest.to_string()));
                break;
            };
            if open > 0 {
                push(&mut stack, Node::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = action_end(after).ok_or_else(|| fail("a '{' is not closed".into()))?;
            let action = after[..close].trim();
            rest = &after[close + 1..];
            if action == "end" {
                let (body, range) = stack.pop().unwrap_or_default();
                let Some((path, relative)) = range else {
                    return Err(fail("{end} without a {range …}".into()));
                };
                push(&mut stack, Node::Range(path, relative, body));
            } else if let Some(expr) = action.strip_prefix("range ") {
                let (path, relative) = path(expr.trim()).map_err(fail)?;
                stack.push((Vec::new(), Some((path, relative))));
            } else if let Some(text) = literal(action) {
                push(&mut stack, Node::Text(text));
            } else {
                let (path, relative) = path(action).map_err(fail)?;
                push(&mut stack, Node::Path(path, relative));
            }
        }
        if stack.len() != 1 {
            return Err(fail("a {range …} has no {end}".into()));
        }
        let nodes = stack.pop().map(|(nodes, _)| nodes).unwrap_or_default();
        Ok(Template { nodes })
    }

    /// The template applied to `doc`.
    pub fn render(&self, doc: &Value) -> String {
        let mut out = String::new();
        render(&self.nodes, doc, doc, &mut out);
        out
    }
}

fn push(stack: &mut [Level], node: Node) {
    if let Some((nodes, _)) = stack.last_mut() {
        nodes.push(node);
    }
}

/// Where the action that starts at `s` ends (its `}`), quotes skipped.
fn action_end(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match quote {
            Some(_) if escaped => escaped = false,
            Some(_) if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '}' => return Some(i),
            None => {}
        }
    }
    None
}

/// `"…"` or `'…'` with its escapes read; `None` when not a literal.
fn literal(action: &str) -> Option<String> {
    let q = action.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let inner = action.strip_prefix(q)?.strip_suffix(q)?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Some(out)
}

/// A kubectl path as an RFC 9535 query, and whether it is relative to the
/// current object (`.x`, `@.x`) rather than the document (`$.x`).
fn path(expr: &str) -> Result<(JsonPath, bool), String> {
    let (query, relative) = if let Some(rest) = expr.strip_prefix('$') {
        (format!("${rest}"), false)
    } else if let Some(rest) = expr.strip_prefix('@') {
        (format!("${rest}"), true)
    } else if expr.starts_with('.') || expr.starts_with('[') {
        (format!("${expr}"), true)
    } else {
        (format!("$.{expr}"), true)
    };
    let query = if query == "$." {
        "$".to_string()
    } else {
        query
    };
    JsonPath::parse(&query)
        .map(|p| (p, relative))
        .map_err(|e| format!("{expr:?} is not a JSONPath: {e}"))
}

fn render(nodes: &[Node], root: &Value, current: &Value, out: &mut String) {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Path(path, relative) => {
                let at = if *relative { current } else { root };
                let values: Vec<String> = path.query(at).all().into_iter().map(text).collect();
                out.push_str(&values.join(" "));
            }
            Node::Range(path, relative, body) => {
                let at = if *relative { current } else { root };
                for item in path.query(at).all() {
                    render(body, root, item, out);
                }
            }
        }
    }
}

/// A result as kubectl prints it: a string bare, anything else as JSON.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list() -> Value {
        json!({"items": [
            {"metadata": {"name": "a", "labels": {"tier": "web"}}, "status": {"ready": 2}},
            {"metadata": {"name": "b", "labels": {}}, "status": {"ready": 0}},
        ]})
    }

    fn run(t: &str, doc: &Value) -> String {
        Template::parse(t).unwrap().render(doc)
    }

    #[test]
    fn kubectl_forms() {
        let doc = list();
        assert_eq!(run("{.items[*].metadata.name}", &doc), "a b");
        assert_eq!(
            run(
                r#"{range .items[*]}{.metadata.name}{"\t"}{.status.ready}{"\n"}{end}"#,
                &doc
            ),
            "a\t2\nb\t0\n"
        );
        assert_eq!(
            run("{.items[?(@.status.ready > 0)].metadata.name}", &doc),
            "a"
        );
        assert_eq!(
            run("{.items[0].metadata.labels}", &doc),
            r#"{"tier":"web"}"#
        );
        assert_eq!(run("names: {.items[1].metadata.name}!", &doc), "names: b!");
        assert_eq!(run(".items[1].metadata.name", &doc), "b");
        assert_eq!(run("{$.items[0].status.ready}", &doc), "2");
        assert_eq!(
            run(
                "{range .items[*]}[{@.metadata.name} of {$.items[0].metadata.name}]{end}",
                &doc
            ),
            "[a of a][b of a]"
        );
        assert_eq!(run("{.missing}", &doc), "");
    }

    #[test]
    fn bad_templates_say_why() {
        for (t, why) in [
            ("{.items", "not closed"),
            ("{range .items[*]}{.x}", "no {end}"),
            ("{end}", "without a {range"),
            ("{.items[}", "not a JSONPath"),
        ] {
            let e = Template::parse(t).unwrap_err().to_string();
            assert!(e.contains(why), "{t}: {e}");
        }
    }
}
