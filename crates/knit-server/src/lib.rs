//! knit-server
