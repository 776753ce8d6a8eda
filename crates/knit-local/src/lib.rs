//! knit-local
