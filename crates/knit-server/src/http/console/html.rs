//! The console's HTML: escaping, the page frame, and small formatters.
//! Pages are built with `format!` over escaped values: every value that
//! comes from the store, a node or a request goes through [`esc`].

use super::session::{Session, CSRF_FIELD};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// `text` safe inside an element or a quoted attribute.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// `text` as one query-string value.
pub fn query_value(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The hidden field every state-changing form carries.
pub fn csrf_field(session: &Session) -> String {
    format!(
        r#"<input type="hidden" name="{CSRF_FIELD}" value="{}">"#,
        esc(&session.csrf)
    )
}

/// Which item of the navigation a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Pools,
    Nodes,
    Events,
    Snapshots,
    Attach,
    SignIn,
}

const NAV: &[(Section, &str, &str)] = &[
    (Section::Pools, "/ui/pools", "Pools"),
    (Section::Nodes, "/ui/nodes", "Nodes"),
    (Section::Events, "/ui/events", "Events"),
    (Section::Snapshots, "/ui/snapshots", "Snapshots"),
    (Section::Attach, "/ui/attach", "Add instances"),
];

/// A whole page: `body` goes into `<main>`. Signed in (`session`), the
/// navigation, the sign-out form and the live-update hook are added.
pub fn page(
    status: StatusCode,
    section: Section,
    title: &str,
    session: Option<&Session>,
    body: &str,
) -> Response {
    let mut nav = String::new();
    if let Some(s) = session {
        nav.push_str(r#"<nav aria-label="Console"><ul>"#);
        for (sec, href, label) in NAV {
            // Adding instances is an operator's: not offered to a viewer.
            if *sec == Section::Attach && !s.may(knit_api::state::TokenRole::Operator) {
                continue;
            }
            let current = if *sec == section {
                r#" aria-current="page""#
            } else {
                ""
            };
            nav.push_str(&format!(
                r#"<li><a href="{href}"{current}>{label}</a></li>"#
            ));
        }
        nav.push_str(&format!(
            r#"</ul><form method="post" action="/ui/sign-out" class="sign-out">{}<button type="submit">Sign out</button></form></nav>"#,
            csrf_field(s)
        ));
    }
    let live = if session.is_some() {
        r#" data-live="/ui/live""#
    } else {
        ""
    };
    let html = format!(
        r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · knit console</title>
<style>{css}</style>
</head>
<body{live}>
<a class="skip" href="#main">Skip to content</a>
<header><span class="brand">knit</span>{nav}</header>
<main id="main" tabindex="-1">
<h1>{title}</h1>
{body}
</main>
<script>{js}</script>
</body>
</html>
"##,
        title = esc(title),
        css = super::CSS,
        js = super::JS,
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

/// A 303 to `location` (after a form post, or to the sign-in page).
pub fn see_other(location: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// A server error as a paragraph: its message and code, then each field
/// error with the field it names.
pub fn error_block(id: &str, err: &crate::error::ServerError) -> String {
    let mut out = format!(
        r#"<div class="error" id="{}" role="alert"><p><strong>{}</strong> <code>{}</code></p>"#,
        esc(id),
        esc(&err.to_string()),
        esc(err.code())
    );
    let fields = err.field_errors();
    if !fields.is_empty() {
        out.push_str(r#"<ul class="field-errors">"#);
        for f in fields {
            out.push_str(&format!(
                r#"<li data-field="{field}"><code>{field}</code>: {rule} (got {value})</li>"#,
                field = esc(&f.field),
                rule = esc(&f.rule),
                value = esc(&f.value)
            ));
        }
        out.push_str("</ul>");
    }
    out.push_str("</div>");
    out
}

/// `ms` ago as a short age (`42s`, `5m`, `3h`, `2d`).
pub fn age(now_ms: i64, then_ms: i64) -> String {
    let s = (now_ms - then_ms).max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A duration in milliseconds, readable (`850 ms`, `12.4 s`, `3m 05s`).
pub fn duration(ms: i64) -> String {
    match ms {
        ..=999 => format!("{} ms", ms.max(0)),
        1000..=59_999 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => format!("{}m {:02}s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

/// A byte count, readable.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A wall-clock time in UTC (`2026-12-01 04:39:53Z`).
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(
            esc(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(query_value("a b&c=d"), "a%20b%26c%3Dd");
    }

    #[test]
    fn times_read_well() {
        assert_eq!(utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc(1_796_099_993_000), "2026-12-01 04:39:53Z");
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(12_400), "12.4 s");
        assert_eq!(duration(185_000), "3m 05s");
        assert_eq!(bytes(2048), "2.0 KiB");
        assert_eq!(age(100_000, 40_000), "1m");
    }
}
