//! A crate's module import graph, read from its source, and the cycles in
//! it: what keeps a crate's layering (docs/architecture.md) true. A test
//! of a crate calls [`assert_no_cycles`] on its own `src/`; reintroducing
//! an upward import fails it, naming the cycle and the lines that tie it.
//!
//! The reading is lexical and covers what knit's code writes: `crate::…`
//! paths (in `use` trees, braces included, and inline in code),
//! `super::…` (inline `mod` blocks counted), and names the crate root
//! re-exports (`use crate::Error` where lib.rs has `pub use error::Error`).
//! Comments, strings and char literals are skipped. `#[cfg(test)]` items
//! are left out: a module's tests may use any room of the crate.
//! Binary roots (`main.rs`, `bin/`) are crates of their own and not read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// One import between two modules, where it is written.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    pub from: String,
    pub to: String,
    /// `src/`-relative file and line of the first path that makes it.
    pub file: String,
    pub line: usize,
    pub path: String,
}

/// A crate's graph: every edge between two different modules.
#[derive(Debug, Default)]
pub struct Graph {
    pub modules: BTreeSet<String>,
    pub edges: Vec<Edge>,
}

/// At what grain modules are nodes of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grain {
    /// `crate::a::b::c` is an edge to `a` (the rooms of the crate).
    TopLevel,
    /// An edge to the module of the file that holds the item
    /// (`a/b.rs` → `a::b`, `a/mod.rs` → `a`).
    File,
}

#[derive(Debug)]
pub struct ReadError(pub String);

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReadError {}

/// Reads the library under `src` (the directory holding `lib.rs`).
pub fn read(src: &Path, grain: Grain) -> Result<Graph, ReadError> {
    let mut files = Vec::new();
    walk(src, src, &mut files)?;
    // Module path of each file.
    let mut file_modules: BTreeMap<Vec<String>, PathBuf> = BTreeMap::new();
    for rel in &files {
        if let Some(m) = module_of(rel) {
            file_modules.insert(m, rel.clone());
        }
    }
    // Files of `#[cfg(test)] mod x;` (and their children) are tests too.
    let mut test_modules: Vec<Vec<String>> = Vec::new();
    for (module, rel) in &file_modules {
        let full = src.join(rel);
        let text = std::fs::read_to_string(&full)
            .map_err(|e| ReadError(format!("reading {}: {e}", full.display())))?;
        for name in test_module_files(&text) {
            let mut m = module.clone();
            m.push(name);
            test_modules.push(m);
        }
    }
    file_modules.retain(|m, _| !test_modules.iter().any(|t| m.starts_with(t)));
    let lib = src.join("lib.rs");
    let root_text = std::fs::read_to_string(&lib)
        .map_err(|e| ReadError(format!("reading {}: {e}", lib.display())))?;
    let reexports = root_reexports(&root_text);

    let mut graph = Graph::default();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    for (module, rel) in &file_modules {
        if module.is_empty() {
            continue; // lib.rs declares and re-exports every room
        }
        let from = node_name(module, grain, &file_modules);
        graph.modules.insert(from.clone());
        let full = src.join(rel);
        let text = std::fs::read_to_string(&full)
            .map_err(|e| ReadError(format!("reading {}: {e}", full.display())))?;
        for (line, path) in paths_in(&text, module) {
            let mut target = path.clone();
            let is_module = file_modules.keys().any(|m| m.first() == target.first());
            if target.len() == 1 && !is_module {
                // A name the root re-exports or defines.
                match reexports.get(&target[0]) {
                    Some(m) => target = m.clone(),
                    None => continue,
                }
            }
            if target.is_empty() {
                continue;
            }
            let to = node_name(&target, grain, &file_modules);
            if to.is_empty() || to == from {
                continue;
            }
            if !seen.insert((from.clone(), to.clone())) {
                continue;
            }
            graph.edges.push(Edge {
                from: from.clone(),
                to,
                file: rel.display().to_string(),
                line,
                path: format!("crate::{}", path.join("::")),
            });
        }
    }
    for e in &graph.edges {
        graph.modules.insert(e.to.clone());
    }
    graph.edges.sort();
    Ok(graph)
}

/// The graph's cycles: each strongly connected set of two or more
/// modules, as one cycle through it with the edges that make it.
pub fn cycles(graph: &Graph) -> Vec<Vec<Edge>> {
    strongly_connected(graph)
        .into_iter()
        .filter(|s| s.len() > 1)
        .map(|scc| {
            let start = scc.iter().next().cloned().unwrap_or_default();
            cycle_through(graph, &scc, &start)
        })
        .collect()
}

/// A shortest cycle through `start` inside the strongly connected set
/// `scc`, by a breadth-first walk back to it.
pub fn cycle_through(graph: &Graph, scc: &BTreeSet<String>, start: &str) -> Vec<Edge> {
    let inside = |e: &&Edge| scc.contains(&e.from) && scc.contains(&e.to);
    let edges: Vec<&Edge> = graph.edges.iter().filter(inside).collect();
    let mut prev: BTreeMap<String, &Edge> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.to_string()]);
    let mut found = None;
    while let Some(m) = queue.pop_front() {
        for e in edges.iter().filter(|e| e.from == m) {
            if e.to == start {
                found = Some(*e);
                break;
            }
            if !prev.contains_key(&e.to) {
                prev.insert(e.to.clone(), e);
                queue.push_back(e.to.clone());
            }
        }
        if found.is_some() {
            break;
        }
    }
    let mut cycle = Vec::new();
    if let Some(last) = found {
        cycle.push(last.clone());
        let mut at = last.from.clone();
        while at != start {
            let Some(e) = prev.get(&at) else { break };
            cycle.push((*e).clone());
            at = e.from.clone();
        }
        cycle.reverse();
    }
    cycle
}

/// Every strongly connected set of the graph (Tarjan), largest first.
pub fn strongly_connected(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        adj: BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let succ = t.adj.get(v).cloned().unwrap_or_default();
        for w in succ {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut set = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                set.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            t.out.push(set);
        }
    }
    let mut t = T {
        adj: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for e in &graph.edges {
        t.adj
            .entry(e.from.as_str())
            .or_default()
            .push(e.to.as_str());
    }
    for m in &graph.modules {
        if !t.index.contains_key(m.as_str()) {
            visit(&mut t, m.as_str());
        }
    }
    let mut out = t.out;
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

/// Describes a cycle: `a -> b -> a` and, under it, each edge's line.
pub fn describe(cycle: &[Edge]) -> String {
    let mut names: Vec<&str> = cycle.iter().map(|e| e.from.as_str()).collect();
    if let Some(first) = cycle.first() {
        names.push(first.from.as_str());
    }
    let mut s = names.join(" -> ");
    for e in cycle {
        s.push_str(&format!(
            "\n    {} -> {}: src/{}:{} uses {}",
            e.from, e.to, e.file, e.line, e.path
        ));
    }
    s
}

/// The graph of `src`'s top-level modules, for the assertions: a graph
/// read with no edge at all means the reader is broken, not the crate clean.
#[track_caller]
fn top_level_graph(src: &Path) -> Graph {
    let graph = match read(src, Grain::TopLevel) {
        Ok(g) => g,
        Err(e) => panic!("reading the module graph of {}: {e}", src.display()),
    };
    assert!(
        !graph.edges.is_empty(),
        "no import between the modules of {} was read: the reader is broken",
        src.display()
    );
    graph
}

/// Fails (panics) naming every cycle between the top-level modules of
/// the library under `src`.
#[track_caller]
pub fn assert_no_cycles(src: &Path) {
    let graph = top_level_graph(src);
    let found = cycles(&graph);
    if !found.is_empty() {
        let text: Vec<String> = found.iter().map(|c| describe(c)).collect();
        panic!(
            "{} has {} module cycle(s); a room must not import one above it \
             (docs/architecture.md): pass what is needed in, or move the shared \
             type down:\n  {}",
            src.display(),
            found.len(),
            text.join("\n  ")
        );
    }
}

/// Fails (panics) when the library under `src` has a cycle between its
/// top-level modules outside the ones `allowed` lists: each strongly
/// connected set must lie inside one allowed set, so a new upward edge
/// that ties in another module, or a new cycle, fails, naming it. For a
/// crate whose last cycles are still to be broken: shrink the list as
/// they go, until [`assert_no_cycles`] can take its place.
#[track_caller]
pub fn assert_cycles_within(src: &Path, allowed: &[&[&str]]) {
    let graph = top_level_graph(src);
    let sets = strongly_connected(&graph);
    let mut bad = Vec::new();
    for set in sets.iter().filter(|s| s.len() > 1) {
        let inside = allowed
            .iter()
            .any(|a| set.iter().all(|m| a.contains(&m.as_str())));
        if !inside {
            // Name a cycle through a module no allowed set has (else one the
            // closest set lacks): what the new edge tied in.
            let closest = allowed
                .iter()
                .max_by_key(|a| set.iter().filter(|m| a.contains(&m.as_str())).count())
                .copied()
                .unwrap_or(&[]);
            let outsider = set
                .iter()
                .find(|m| !allowed.iter().any(|a| a.contains(&m.as_str())))
                .or_else(|| set.iter().find(|m| !closest.contains(&m.as_str())))
                .cloned()
                .unwrap_or_default();
            let names: Vec<&str> = set.iter().map(String::as_str).collect();
            bad.push(format!(
                "{{{}}} is one cycle, not within the allowed sets; through {outsider}: {}",
                names.join(", "),
                describe(&cycle_through(&graph, set, &outsider))
            ));
        }
    }
    if !bad.is_empty() {
        panic!(
            "{} has module cycles beyond those still to be broken; a room must not \
             import one above it (docs/architecture.md):\n  {}",
            src.display(),
            bad.join("\n  ")
        );
    }
}

fn walk(src: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ReadError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| ReadError(format!("listing {}: {e}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| ReadError(format!("listing {}: {e}", dir.display())))?;
        let path = entry.path();
        let rel = path.strip_prefix(src).unwrap_or(&path).to_path_buf();
        if path.is_dir() {
            if rel == Path::new("bin") {
                continue;
            }
            walk(src, &path, out)?;
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(rel);
        }
    }
    Ok(())
}

fn module_of(rel: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.is_empty() && stem == "main" {
        return None;
    }
    if !(parts.is_empty() && stem == "lib") && stem != "mod" {
        parts.push(stem.to_string());
    }
    Some(parts)
}

fn node_name(path: &[String], grain: Grain, files: &BTreeMap<Vec<String>, PathBuf>) -> String {
    match grain {
        Grain::TopLevel => path.first().cloned().unwrap_or_default(),
        Grain::File => {
            let mut n = path.len();
            while n > 0 && !files.contains_key(&path[..n]) {
                n -= 1;
            }
            path[..n].join("::")
        }
    }
}

/// Names the root re-exports (`pub use a::X;`, `pub use a::{X, Y};`,
/// `pub use a::*` is not resolved) to the module path they come from.
fn root_reexports(text: &str) -> BTreeMap<String, Vec<String>> {
    let toks = tokens(text);
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].text == "use" {
            let mut j = i + 1;
            let mut trees = Vec::new();
            use_tree(&toks, &mut j, Vec::new(), &mut trees);
            for (path, _) in trees {
                let mut path = path;
                if path.first().is_some_and(|p| p == "crate" || p == "self") {
                    path.remove(0);
                }
                if path.len() >= 2 {
                    let name = path.last().cloned().unwrap_or_default();
                    path.pop();
                    out.insert(name, path);
                }
            }
            i = j;
        }
        i += 1;
    }
    out
}

#[derive(Debug, Clone)]
struct Tok {
    text: String,
    line: usize,
}

/// Identifiers and punctuation, with comments, strings and chars gone.
fn tokens(text: &str) -> Vec<Tok> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let n = b.len();
    while i < n {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && i + 1 < n && b[i + 1] == b'/' {
            while i < n && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && i + 1 < n && b[i + 1] == b'*' {
            let mut depth = 0;
            while i < n {
                if b[i] == b'/' && i + 1 < n && b[i + 1] == b'*' {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && i + 1 < n && b[i + 1] == b'/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == b'r' && i + 1 < n && (b[i + 1] == b'"' || b[i + 1] == b'#') && {
            // r"…" or r#"…"#, not an identifier starting with r.
            let mut j = i + 1;
            while j < n && b[j] == b'#' {
                j += 1;
            }
            j < n && b[j] == b'"'
        } {
            let mut j = i + 1;
            let mut hashes = 0;
            while b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            j += 1; // past the opening quote
            while j < n {
                if b[j] == b'\n' {
                    line += 1;
                }
                if b[j] == b'"' && b[j + 1..].iter().take_while(|&&h| h == b'#').count() >= hashes {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c == b'"' || (c == b'b' && i + 1 < n && b[i + 1] == b'"') {
            let mut j = if c == b'b' { i + 2 } else { i + 1 };
            while j < n && b[j] != b'"' {
                if b[j] == b'\\' {
                    j += 1;
                }
                if j < n && b[j] == b'\n' {
                    line += 1;
                }
                j += 1;
            }
            i = j + 1;
        } else if c == b'\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if i + 2 < n && b[i + 1] == b'\\' {
                let mut j = i + 3; // past the escaped char
                while j < n && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
            } else if i + 2 < n && b[i + 2] == b'\'' {
                i += 3;
            } else {
                // Multi-byte UTF-8 char literal or a lifetime.
                let rest = &text[i + 1..];
                let mut chars = rest.char_indices();
                match (chars.next(), chars.next()) {
                    (Some((_, ch)), Some((k, '\''))) if !ch.is_ascii() => i += 1 + k + 1,
                    _ => i += 1,
                }
            }
        } else if c == b'_' || c == b'$' || c.is_ascii_alphabetic() {
            let s = i;
            i += 1;
            while i < n && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                i += 1;
            }
            let word = &text[s..i];
            let word = if word == "$crate" { "crate" } else { word };
            out.push(Tok {
                text: word.to_string(),
                line,
            });
        } else if c == b':' && i + 1 < n && b[i + 1] == b':' {
            out.push(Tok {
                text: "::".into(),
                line,
            });
            i += 2;
        } else if c.is_ascii() {
            out.push(Tok {
                text: (c as char).to_string(),
                line,
            });
            i += 1;
        } else {
            // Non-ASCII outside strings (in an identifier): skip the char.
            let ch_len = text[i..].chars().next().map(char::len_utf8).unwrap_or(1);
            i += ch_len;
        }
    }
    out
}

/// Reads a use tree (or an inline path) at `toks[*i]`, appending each full
/// path it names with its line. Stops after the tree.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: Vec<String>, out: &mut Vec<(Vec<String>, usize)>) {
    let mut path = prefix;
    while let Some(t) = toks.get(*i) {
        if t.text == "{" {
            *i += 1;
            loop {
                match toks.get(*i).map(|t| t.text.as_str()) {
                    None => return,
                    Some("}") => {
                        *i += 1;
                        return;
                    }
                    Some(",") => *i += 1,
                    Some(_) => use_tree(toks, i, path.clone(), out),
                }
            }
        }
        if t.text == "*" {
            *i += 1;
            out.push((path, t.line));
            return;
        }
        if !is_ident(&t.text) {
            out.push((path, t.line));
            return;
        }
        let line = t.line;
        if t.text == "self" && !path.is_empty() {
            *i += 1;
        } else {
            path.push(t.text.clone());
            *i += 1;
        }
        if toks.get(*i).is_some_and(|t| t.text == "::")
            && toks
                .get(*i + 1)
                .is_some_and(|t| t.text == "{" || t.text == "*" || is_ident(&t.text))
        {
            *i += 1;
            continue;
        }
        out.push((path, line));
        return;
    }
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
}

/// Every `crate::`/`super::` path in a file of module `module`, resolved
/// to a path from the crate root, with its line. `#[cfg(test)]` items and
/// inline `mod` blocks are followed.
fn paths_in(text: &str, module: &[String]) -> Vec<(usize, Vec<String>)> {
    let toks = tokens(text);
    let mut out = Vec::new();
    // Inline modules: (name, brace depth at which it closes).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut skip_until: Option<usize> = None; // a #[cfg(test)] item's depth
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i].text;
        if t == "{" {
            depth += 1;
            i += 1;
            continue;
        }
        if t == "}" {
            depth = depth.saturating_sub(1);
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
            if skip_until == Some(depth) {
                skip_until = None;
            }
            i += 1;
            continue;
        }
        if skip_until.is_some() {
            i += 1;
            continue;
        }
        // #[cfg(test)]: skip the item it is on (to its `;` or its block).
        if t == "#" && is_cfg_test(&toks, i) {
            let mut j = i + 1;
            // past the attribute's closing ]
            let mut sq = 0;
            while j < toks.len() {
                match toks[j].text.as_str() {
                    "[" => sq += 1,
                    "]" => {
                        sq -= 1;
                        if sq == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            j += 1;
            while j < toks.len() && toks[j].text != "{" && toks[j].text != ";" {
                j += 1;
            }
            if toks.get(j).is_some_and(|t| t.text == "{") {
                skip_until = Some(depth);
                depth += 1;
            }
            i = j + 1;
            continue;
        }
        if t == "mod" && toks.get(i + 2).is_some_and(|t| t.text == "{") {
            inline.push((toks[i + 1].text.clone(), depth));
            depth += 1;
            i += 3;
            continue;
        }
        let here: Vec<String> = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        let starts_path = (t == "crate" || t == "super")
            && toks.get(i + 1).is_some_and(|t| t.text == "::")
            && !(i > 0 && toks[i - 1].text == "::");
        if starts_path {
            let mut trees = Vec::new();
            let mut j = i;
            use_tree(&toks, &mut j, Vec::new(), &mut trees);
            for (path, line) in trees {
                if let Some(p) = resolve(&path, &here) {
                    out.push((line, p));
                }
            }
            i = j.max(i + 1);
            continue;
        }
        i += 1;
    }
    out
}

/// The names of `#[cfg(test)] mod name;` declarations (tests in a file
/// of their own).
fn test_module_files(text: &str) -> Vec<String> {
    let toks = tokens(text);
    let mut out = Vec::new();
    for i in 0..toks.len() {
        if toks[i].text == "#" && is_cfg_test(&toks, i) {
            let mut j = i + 7; // past `# [ cfg ( test ) ]`
            if toks.get(j).is_some_and(|t| t.text == "pub") {
                j += 1;
                if toks.get(j).is_some_and(|t| t.text == "(") {
                    while toks.get(j).is_some_and(|t| t.text != ")") {
                        j += 1;
                    }
                    j += 1;
                }
            }
            if toks.get(j).is_some_and(|t| t.text == "mod")
                && toks.get(j + 2).is_some_and(|t| t.text == ";")
            {
                out.push(toks[j + 1].text.clone());
            }
        }
    }
    out
}

fn is_cfg_test(toks: &[Tok], i: usize) -> bool {
    let s: Vec<&str> = toks[i..toks.len().min(i + 6)]
        .iter()
        .map(|t| t.text.as_str())
        .collect();
    s == ["#", "[", "cfg", "(", "test", ")"]
}

fn resolve(path: &[String], here: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String>;
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &rest[1..];
        }
        Some("super") => {
            base = here.to_vec();
            while rest.first().is_some_and(|p| p == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph_of(files: &[(&str, &str)]) -> (tempfile_free::Dir, Graph) {
        let dir = tempfile_free::Dir::new();
        for (name, text) in files {
            let p = dir.0.join(name);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, text).expect("write");
        }
        let g = read(&dir.0, Grain::TopLevel).expect("read");
        (dir, g)
    }

    /// A directory of the test's own, removed when dropped (panics too).
    mod tempfile_free {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!(
                    "knit-layers-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                ));
                std::fs::create_dir_all(&p).expect("mkdir");
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn every_kind_of_path_is_an_edge() {
        let (_d, g) = graph_of(&[
            (
                "lib.rs",
                "pub mod a; pub mod b; pub mod c; pub mod d; pub mod e;\npub use d::Thing;",
            ),
            ("e.rs", ""),
            (
                "a.rs",
                "use crate::{b::X, c};\nuse crate::e;\nfn f() { crate::d::g(); }",
            ),
            ("b/mod.rs", "mod inner;\n"),
            (
                "b/inner.rs",
                "use super::super::c::Y; // crate::a::nope\nconst S: &str = \"crate::a::Z\";",
            ),
            (
                "c.rs",
                "fn f() -> crate::Thing { todo!() }\n#[cfg(test)]\nmod tests { use crate::a::T; }",
            ),
            (
                "d.rs",
                "fn f(x: &'static str) -> char { 'a' }\nmod m { fn g() { super::super::b::h(); } }",
            ),
        ]);
        let pairs: Vec<(&str, &str)> = g
            .edges
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("a", "b"),
                ("a", "c"),
                ("a", "d"),
                ("a", "e"),
                ("b", "c"),
                ("c", "d"),
                ("d", "b")
            ]
        );
        let found = cycles(&g);
        assert_eq!(found.len(), 1);
        assert!(
            describe(&found[0]).starts_with("b -> c -> d -> b"),
            "{}",
            describe(&found[0])
        );
    }

    #[test]
    fn test_files_are_left_out_and_allowed_cycles_pass() {
        let (d, g) = graph_of(&[
            ("lib.rs", "pub mod a; pub mod b;"),
            (
                "a/mod.rs",
                "use crate::b::X;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\npub(crate) mod testing;",
            ),
            ("a/testing.rs", "use crate::b::W;"),
            ("a/tests.rs", "use crate::b::Y;"),
            ("b.rs", "use crate::a::Z;"),
        ]);
        assert_eq!(g.edges.len(), 2, "{:?}", g.edges);
        assert_eq!(g.edges[0].file, "a/mod.rs");
        assert_cycles_within(&d.0, &[&["a", "b"]]);
        let refused = std::panic::catch_unwind(|| assert_cycles_within(&d.0, &[&["a", "c"]]));
        assert!(refused.is_err(), "a cycle outside the allowed sets passed");
    }

    #[test]
    fn a_cycle_is_found_and_described() {
        let (_d, g) = graph_of(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
            ("a.rs", "use crate::b::X;"),
            ("b.rs", "pub(crate) fn f() { crate::c::g() }"),
            ("c.rs", "\n\nuse crate::a::{self, Y};"),
        ]);
        let found = cycles(&g);
        assert_eq!(found.len(), 1);
        let text = describe(&found[0]);
        assert!(text.starts_with("a -> b -> c -> a"), "{text}");
        assert!(text.contains("c -> a: src/c.rs:3 uses crate::a"), "{text}");
    }
}
