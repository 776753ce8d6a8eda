//! The copies of knit-api's lists that must stay copies (docs a reader
//! reads without the code) are held to the one source here; a drift fails
//! naming file and line.
//!
//! - docs/agent.md's phase table: one row per phase, numbered, in
//!   `PhaseName::ALL`'s order.
//! - "N phases" in a doc or a comment: N is the number of phases.
//! - docs/control-plane.md's route table: every `METHOD /path` it names is
//!   a route of `Route::ALL`, and every route is named there.

use knit_api::routes::Route;
use knit_api::PhaseName;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The cells of a Markdown table row (`| a | b |`), trimmed; `\|` stays
/// inside its cell.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                out.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The rows (1-based line, cells) of the table whose header row starts
/// with `header`.
fn table(text: &str, header: &str) -> Vec<(usize, Vec<String>)> {
    let mut lines = text
        .lines()
        .enumerate()
        .skip_while(|(_, l)| !l.trim_start().starts_with(header));
    assert!(
        lines.next().is_some(),
        "no table whose header is {header:?}"
    );
    lines
        .take_while(|(_, l)| l.trim_start().starts_with('|'))
        // The `|---|` row.
        .skip(1)
        .map(|(i, l)| (i + 1, cells(l)))
        .collect()
}

#[test]
fn agent_md_lists_every_phase_in_run_order() {
    let text = read("docs/agent.md");
    let rows = table(&text, "| # | name |");
    let mut documented = Vec::new();
    for (line, row) in &rows {
        let number: usize = row[0]
            .parse()
            .unwrap_or_else(|_| panic!("docs/agent.md:{line}: {:?} is not a number", row[0]));
        let name = row[1].trim_matches('`');
        assert_eq!(
            number,
            documented.len() + 1,
            "docs/agent.md:{line}: row {number} out of sequence"
        );
        let phase = PhaseName::parse(name)
            .unwrap_or_else(|| panic!("docs/agent.md:{line}: {name:?} is not a phase"));
        let want = PhaseName::ALL.get(documented.len());
        assert_eq!(
            Some(&phase),
            want,
            "docs/agent.md:{line}: phase {number} is {name}, PhaseName::ALL says {want:?}"
        );
        documented.push(phase);
    }
    assert_eq!(
        documented,
        PhaseName::ALL,
        "docs/agent.md's phase table lacks phases at its end"
    );
}

/// Files under `dir` (recursively) whose extension is one of `exts`.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            files(&path, exts, out);
        } else if path
            .extension()
            .is_some_and(|e| exts.iter().any(|x| e == *x))
        {
            out.push(path);
        }
    }
}

#[test]
fn every_count_of_phases_is_the_number_of_phases() {
    const NUMBERS: [&str; 20] = [
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
    ];
    let root = repo_root();
    let mut scanned = Vec::new();
    files(&root.join("docs"), &["md"], &mut scanned);
    files(&root.join("crates"), &["rs", "md"], &mut scanned);
    scanned.push(root.join("README.md"));
    let want = PhaseName::ALL.len();
    let mut wrong = Vec::new();
    let mut found = 0;
    // This file names counts it does not mean.
    let this = root.join("crates/knit-api/tests/lists.rs");
    for path in scanned.iter().filter(|p| **p != this) {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            let words: Vec<String> = line
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_lowercase)
                .collect();
            for pair in words.windows(2) {
                if pair[1] != "phases" {
                    continue;
                }
                let n = NUMBERS
                    .iter()
                    .position(|w| *w == pair[0])
                    .map(|p| p + 1)
                    .or_else(|| pair[0].parse().ok());
                if let Some(n) = n {
                    found += 1;
                    if n != want {
                        let rel = path.strip_prefix(&root).unwrap_or(path);
                        wrong.push(format!("{}:{}: {} phases", rel.display(), i + 1, pair[0]));
                    }
                }
            }
        }
    }
    assert!(
        found > 0,
        "no count of phases found: the scan reads nothing"
    );
    assert!(
        wrong.is_empty(),
        "the agent has {want} phases (knit_api::PhaseName::ALL), these say otherwise:\n{}",
        wrong.join("\n")
    );
}

/// (method, path) of every route docs/control-plane.md's route table
/// names: each code span of a row's first cell is `METHOD[, METHOD…]
/// /path[?query]`, paths in OpenAPI's form.
fn documented_routes(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (line, row) in table(text, "| route | auth | what |") {
        let spans: Vec<&str> = row[0].split('`').skip(1).step_by(2).collect();
        assert!(
            !spans.is_empty(),
            "docs/control-plane.md:{line}: no `METHOD /path`"
        );
        for span in spans {
            let Some((methods, path)) = span.split_once(" /") else {
                panic!("docs/control-plane.md:{line}: {span:?} is not `METHOD /path`")
            };
            let path = format!("/{}", path.split('?').next().unwrap_or(path));
            for method in methods.split(',') {
                out.push((line, method.trim().to_string(), path.clone()));
            }
        }
    }
    out
}

#[test]
fn control_plane_md_names_every_route_and_no_other() {
    let text = read("docs/control-plane.md");
    let documented = documented_routes(&text);
    let routes: BTreeSet<(String, String)> = Route::ALL
        .iter()
        .map(|r| (r.method().as_str().to_string(), r.openapi_path()))
        .collect();
    for (line, method, path) in &documented {
        assert!(
            routes.contains(&(method.clone(), path.clone())),
            "docs/control-plane.md:{line}: {method} {path} is no route of knit_api::routes::Route"
        );
    }
    let named: BTreeSet<(String, String)> =
        documented.into_iter().map(|(_, m, p)| (m, p)).collect();
    let missing: Vec<String> = routes
        .difference(&named)
        .map(|(m, p)| format!("{m} {p}"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/control-plane.md's route table does not name: {}",
        missing.join(", ")
    );
}
