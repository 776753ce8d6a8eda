//! knit-cluster
