//! Values as POSIX shell words, through shlex: a value made only of plain
//! characters is written as it is, any other in quotes, so that `sh`
//! reads back exactly the bytes given. A NUL cannot be in a shell word
//! and is refused.

use crate::error::{OsError, Result};

/// `value` as one shell word.
pub fn quote(value: &str) -> Result<String> {
    shlex::try_quote(value)
        .map(|w| w.into_owned())
        .map_err(|_| OsError::Quote {
            value: value.to_string(),
            rule: "a shell word cannot hold a NUL byte",
        })
}

/// `words` as one shell command line (each quoted, joined by spaces).
pub fn join<'a>(words: impl IntoIterator<Item = &'a str>) -> Result<String> {
    words
        .into_iter()
        .map(quote)
        .collect::<Result<Vec<_>>>()
        .map(|w| w.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const HARD: [&str; 12] = [
        "",
        "plain/path-1.2_x:y@z%+=,",
        "two words",
        "it's",
        "\"double\" and 'single'",
        "line one\nline two\n",
        "$HOME `id` $(id) \\ ; & | > < * ? [a] ~ # !",
        "\t tab and trailing space ",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        "ünïcödé ✓",
        "'",
        "\\'\\\"",
    ];

    #[test]
    fn values_come_back_byte_identical_through_a_real_sh() {
        for value in HARD {
            // printf %s prints the one argument exactly, newlines included.
            let line = format!("printf %s {}", quote(value).unwrap());
            let out = Command::new("sh").arg("-c").arg(&line).output().unwrap();
            assert!(out.status.success(), "{line}: {out:?}");
            assert_eq!(
                String::from_utf8(out.stdout).unwrap(),
                value,
                "through {line}"
            );
        }
    }

    #[test]
    fn a_joined_line_is_one_argument_per_word_through_a_real_sh() {
        let line = format!("printf '%s\\0' {}", join(HARD).unwrap());
        let out = Command::new("sh").arg("-c").arg(&line).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let back: Vec<&[u8]> = out
            .stdout
            .strip_suffix(b"\0")
            .unwrap()
            .split(|b| *b == 0)
            .collect();
        let want: Vec<&[u8]> = HARD.iter().map(|v| v.as_bytes()).collect();
        assert_eq!(back, want);
    }

    #[test]
    fn plain_values_stay_as_they_are_and_nul_is_refused() {
        assert_eq!(quote("/var/lib/knit").unwrap(), "/var/lib/knit");
        assert_eq!(quote("").unwrap(), "''");
        let err = quote("a\0b").unwrap_err();
        assert_eq!(err.code(), "QuoteInvalid");
        assert!(err.to_string().contains("NUL"), "{err}");
    }
}
