//! knit-kubelet-sim
