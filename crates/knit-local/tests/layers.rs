//! The local cloud's rooms import only rooms below them
//! (docs/architecture.md, knit-local): the module graph read from `src/`
//! has no cycle. cloud/ on top; blockstore, boot, net, image below it;
//! loopdev, mounts, state, model, run, pause the floor.

use std::path::Path;

#[test]
fn no_module_imports_one_above_it() {
    knit_test_support::layers::assert_no_cycles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
