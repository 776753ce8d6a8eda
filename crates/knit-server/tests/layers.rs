//! The control plane's rooms import only rooms below them
//! (docs/architecture.md, "Inside the control plane"): the module graph
//! read from `src/` has no cycle. A new upward import fails, naming the
//! cycle it makes and the lines that tie it.

use std::path::Path;

#[test]
fn no_module_imports_one_above_it() {
    knit_test_support::layers::assert_no_cycles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
