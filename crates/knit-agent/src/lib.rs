//! knit-agent
