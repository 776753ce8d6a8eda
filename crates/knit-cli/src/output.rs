//! kubectl-style output: aligned tables, ages, durations, `-o json|yaml`.

use serde_json::Value;
use std::fmt::Display;

/// Seconds → `5s`, `3m`, `2h`, `4d` (kubectl's AGE column).
pub fn age(from_ms: i64, now_ms: i64) -> String {
    let s = ((now_ms - from_ms).max(0)) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Milliseconds → `850ms`, `3.2s`, `2m05s`.
pub fn duration(ms: i64) -> String {
    match ms {
        i64::MIN..=999 => format!("{}ms", ms.max(0)),
        1000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

/// Left-aligned columns separated by three spaces, as kubectl prints them.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `-o` of `get` and `describe`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Wide,
    Json,
    Yaml,
}

/// A value as a table cell; empty text as `<none>`.
pub fn cell(v: impl Display) -> String {
    let text = v.to_string();
    if text.is_empty() {
        "<none>".to_string()
    } else {
        text
    }
}

/// An optional value as a table cell: absent as `<none>`.
pub fn opt<T: Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "<none>".to_string(), cell)
}

/// A document the server sent, as `-o json` or `-o yaml` prints it.
pub fn document(format: Format, v: &Value) -> String {
    match format {
        Format::Yaml => yaml(v),
        Format::Json | Format::Wide => json(v),
    }
}

pub fn yaml(v: &Value) -> String {
    serde_yaml_ng::to_string(v).unwrap_or_else(|e| format!("# cannot render as YAML: {e}\n"))
}

pub fn json(v: &Value) -> String {
    knit_api::ser::value_pretty(v) + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_durations() {
        assert_eq!(age(0, 5_000), "5s");
        assert_eq!(age(0, 600_000), "10m");
        assert_eq!(age(0, 3 * 86_400_000), "3d");
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(3_240), "3.2s");
        assert_eq!(duration(125_000), "2m05s");
    }

    #[test]
    fn tables_align() {
        let out = table(
            &["NAME", "STATUS"],
            &[
                vec!["a".into(), "Ready".into()],
                vec!["long-name".into(), "NotReady".into()],
            ],
        );
        assert_eq!(
            out,
            "NAME        STATUS\na           Ready\nlong-name   NotReady\n"
        );
    }
}
