//! Enums whose variants are words, each word written once: [`word_enum!`]
//! gives the serde name, `as_str`, `ALL` (declaration order), `Display` and
//! a `FromStr` that refuses any other word naming the field and the words
//! allowed. The states of [`crate::state`] and the phase names of
//! [`crate::phase`] are declared with it.

use crate::error::FieldError;

/// An enum whose variants are words: serde names, `as_str`, `ALL`,
/// `Display`, and `FromStr` refusing any other word with a [`FieldError`]
/// that names the field and the words allowed.
macro_rules! word_enum {
    (
        $(#[$meta:meta])*
        $name:ident, field = $field:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $word:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
            ::serde::Serialize, ::serde::Deserialize,
        )]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $word)] $variant, )+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word on the wire and in the database.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::error::FieldError;

            fn from_str(word: &str) -> Result<Self, $crate::error::FieldError> {
                match word {
                    $($word => Ok($name::$variant),)+
                    _ => Err($crate::word::unknown_word($field, word, &[$($word),+])),
                }
            }
        }
    };
}

pub(crate) use word_enum;

pub(crate) fn unknown_word(field: &str, word: &str, allowed: &[&str]) -> FieldError {
    FieldError {
        field: field.to_string(),
        value: format!("{word:?}"),
        rule: format!("must be one of {}", allowed.join(", ")),
    }
}
