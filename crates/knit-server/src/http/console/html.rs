//! The console's HTML: the page frame, error blocks and small formatters.
//! Pages are maud templates (`html!`): every value spliced into one is
//! escaped unless wrapped in `PreEscaped`, which only the inlined
//! stylesheet and script are (constants of the crate, hashed in the CSP).

use super::session::{Session, CSRF_FIELD};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, PreEscaped, DOCTYPE};

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
pub fn csrf_field(session: &Session) -> Markup {
    html! { input type="hidden" name=(CSRF_FIELD) value=(session.csrf); }
}

/// A table's header row: one column header per name.
pub fn thead(columns: &[&str]) -> Markup {
    html! {
        thead {
            tr {
                @for col in columns {
                    th scope="col" { (col) }
                }
            }
        }
    }
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
    body: Markup,
) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · knit console" }
                // A constant of the crate, allowed by its hash in the CSP.
                style { (PreEscaped(super::CSS)) }
            }
            body data-live=[session.map(|_| "/ui/live")] {
                a.skip href="#main" { "Skip to content" }
                header {
                    span.brand { "knit" }
                    @if let Some(s) = session {
                        nav aria-label="Console" {
                            ul {
                                @for (sec, href, label) in NAV {
                                    // Adding instances is an operator's: not offered to a viewer.
                                    @if *sec != Section::Attach || s.may(knit_api::state::TokenRole::Operator) {
                                        li { a href=(href) aria-current=[(*sec == section).then_some("page")] { (label) } }
                                    }
                                }
                            }
                            form.sign-out method="post" action="/ui/sign-out" {
                                (csrf_field(s))
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main #main tabindex="-1" {
                    h1 { (title) }
                    (body)
                }
                script { (PreEscaped(super::JS)) }
            }
        }
    };
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

/// A 303 to `location` (after a form post, or to the sign-in page).
pub fn see_other(location: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// A server error as a paragraph: its message and code, then each field
/// error with the field it names.
pub fn error_block(id: &str, err: &crate::error::ServerError) -> Markup {
    let fields = err.field_errors();
    html! {
        div.error id=(id) role="alert" {
            p { strong { (err) } " " code { (err.code()) } }
            @if !fields.is_empty() {
                ul.field-errors {
                    @for f in fields {
                        li data-field=(f.field) { code { (f.field) } ": " (f.rule) " (got " (f.value) ")" }
                    }
                }
            }
        }
    }
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

/// A wall-clock time in UTC (`2026-12-01 04:39:53Z`): RFC 3339 with a
/// space for the `T`, easier to read in a table.
pub fn utc(ms: i64) -> String {
    knit_os::time::rfc3339_ms(ms).replacen('T', " ", 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("a b&c=d"), "a%20b%26c%3Dd");
    }

    #[test]
    fn times_read_well() {
        assert_eq!(utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc(1_796_099_993_000), "2026-12-01 04:39:53Z");
        assert_eq!(utc(951_782_400_999), "2000-02-29 00:00:00Z");
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(12_400), "12.4 s");
        assert_eq!(duration(185_000), "3m 05s");
        assert_eq!(bytes(2048), "2.0 KiB");
        assert_eq!(age(100_000, 40_000), "1m");
    }
}
