//! Every reference to a section of docs/spec.md resolves: a "spec" or
//! "docs/spec.md" followed by the section sign and a number, in any source,
//! script or doc of the repository, names a heading of docs/spec.md with that
//! number; every Markdown link `spec.md#anchor` names one of its headings.
//! A reference to a removed or renumbered section fails here, with its file
//! and line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The section sign, written as an escape so that this file holds none.
const SECTION: char = '\u{a7}';

/// Extensions scanned (code comments, scripts, configs, docs).
const SCANNED: &[&str] = &["rs", "md", "sh", "yaml", "yml", "toml"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// GitHub's anchor for a heading: lower case; letters, digits, '-' and '_'
/// kept, spaces turned into '-', everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The section numbers and anchors of the spec's headings.
struct Headings {
    numbers: BTreeSet<String>,
    anchors: BTreeSet<String>,
}

fn headings(spec: &str) -> Headings {
    let mut numbers = BTreeSet::new();
    let mut anchors = BTreeSet::new();
    let mut in_fence = false;
    for line in spec.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence || !line.starts_with('#') {
            continue;
        }
        let text = line.trim_start_matches('#').trim();
        anchors.insert(slug(text));
        let first = text.split_whitespace().next().unwrap_or("");
        let number = first.trim_end_matches('.');
        if !number.is_empty() && number.chars().all(|c| c.is_ascii_digit() || c == '.') {
            numbers.insert(number.to_string());
        }
    }
    Headings { numbers, anchors }
}

/// A section number at the start of `s`: digits and dots, no trailing dot.
fn number_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    s[..end].trim_end_matches('.')
}

/// The problems of one file's text: `(line, message)`. `internal` is set for
/// the spec itself, where a bare section sign refers to its own sections and
/// `#anchor` links to its own headings.
fn problems(text: &str, markdown: bool, internal: bool, h: &Headings) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        for (at, _) in line.match_indices(SECTION) {
            let before = line[..at].to_lowercase();
            let names_spec = before.ends_with("spec ") || before.ends_with("spec.md ");
            if !(names_spec || internal) {
                continue;
            }
            let after = &line[at + SECTION.len_utf8()..];
            let number = number_at(after);
            if number.is_empty() {
                if names_spec {
                    out.push((
                        lineno,
                        "a spec reference with no section number".to_string(),
                    ));
                }
                continue;
            }
            let rest = &after[number.len()..];
            // The old form "1 3.1" / "1 step 2" names a subsection in two
            // numbers; the spec numbers it as one ("1.3.1", "1.2").
            if rest.starts_with(' ')
                && (rest[1..].starts_with(|c: char| c.is_ascii_digit())
                    || rest[1..].starts_with("step"))
            {
                let second = rest[1..]
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == ' '))
                    .next()
                    .unwrap_or("")
                    .trim_end_matches('.');
                out.push((
                    lineno,
                    format!(
                        "`{SECTION}{number} {second}` names a subsection in two parts: write its one number, as docs/spec.md's headings do"
                    ),
                ));
                continue;
            }
            if !h.numbers.contains(number) {
                out.push((
                    lineno,
                    format!("section {number} is not a heading of docs/spec.md"),
                ));
            }
        }
        if markdown {
            let mut links: Vec<&str> = line.split("spec.md#").skip(1).collect();
            if internal {
                links.extend(line.split("](#").skip(1));
            }
            for link in links {
                let anchor: String = link
                    .chars()
                    .take_while(|c| !matches!(c, ')' | ' ' | '"' | '>' | '`'))
                    .collect();
                if !h.anchors.contains(&anchor) {
                    out.push((
                        lineno,
                        format!("anchor #{anchor} is not a heading of docs/spec.md"),
                    ));
                }
            }
        }
    }
    out
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            // Build output and git's own files are not the repository's text.
            if name != "target" && name != ".git" {
                walk(&path, files);
            }
        } else if kind.is_file()
            && path
                .extension()
                .is_some_and(|e| SCANNED.iter().any(|s| e == *s))
        {
            files.push(path);
        }
    }
}

#[test]
fn every_spec_reference_names_a_section_of_docs_spec_md() {
    let root = repo_root();
    let spec_path = root.join("docs/spec.md");
    let spec = std::fs::read_to_string(&spec_path)
        .unwrap_or_else(|e| panic!("{}: {e}", spec_path.display()));
    let h = headings(&spec);
    for wanted in ["1", "1.3.1", "1.3.7", "2.3", "3.2", "4.1", "5.12", "6.5"] {
        assert!(
            h.numbers.contains(wanted),
            "docs/spec.md has no heading numbered {wanted}: {:?}",
            h.numbers
        );
    }

    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    let mut found = 0usize;
    let mut bad = Vec::new();
    for file in &files {
        // Non-UTF-8 files hold no references worth checking.
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let rel = file.strip_prefix(&root).unwrap_or(file);
        let markdown = file.extension().is_some_and(|e| e == "md");
        let internal = rel == Path::new("docs/spec.md");
        found += text
            .to_lowercase()
            .matches(&format!("spec {SECTION}"))
            .count()
            + text
                .to_lowercase()
                .matches(&format!("spec.md {SECTION}"))
                .count();
        for (line, message) in problems(&text, markdown, internal, &h) {
            bad.push(format!("{}:{line}: {message}", rel.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "{} spec reference(s) do not resolve:\n{}",
        bad.len(),
        bad.join("\n")
    );
    // The code and docs refer to the spec in dozens of places: finding few
    // means the scan looked in the wrong place, not that all is well.
    assert!(
        found >= 40,
        "only {found} spec references found under {}",
        root.display()
    );
}

/// The checks refuse what they must (so that the test above can fail).
#[test]
fn a_reference_to_a_missing_section_or_anchor_is_reported() {
    let spec = "# Title\n## 1. One\n### 1.2 Two parts\n```\n## 9. fenced\n```\n";
    let h = headings(spec);
    assert_eq!(
        h.numbers,
        BTreeSet::from(["1".to_string(), "1.2".to_string()])
    );
    assert!(h.anchors.contains("12-two-parts"), "{:?}", h.anchors);

    let ok = format!("see docs/spec.md {SECTION}1.2. And [spec {SECTION}1](spec.md#1-one).");
    assert_eq!(problems(&ok, true, false, &h), vec![]);

    let text = format!(
        "a\n// docs/spec.md {SECTION}9 here\n(SPEC {SECTION}1 3.1)\n[x](spec.md#nope)\nlaw {SECTION}9 elsewhere\n"
    );
    let found = problems(&text, true, false, &h);
    let lines: Vec<usize> = found.iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, vec![2, 3, 4], "{found:?}");
    assert!(
        found[0].1.contains("section 9 is not a heading"),
        "{found:?}"
    );
    assert!(found[1].1.contains("two parts"), "{found:?}");
    assert!(found[2].1.contains("#nope"), "{found:?}");

    // Inside the spec a bare section sign is one of its own references.
    let inner = format!("as {SECTION}1.2 and {SECTION}7 say, [here](#1-one), [there](#gone)\n");
    let found = problems(&inner, true, true, &h);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].1.contains("section 7"), "{found:?}");
    assert!(found[1].1.contains("#gone"), "{found:?}");
}
