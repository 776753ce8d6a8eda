//! The agent's rooms import only rooms below them (docs/architecture.md,
//! "The node agent inside"): the module graph read from `src/` has no
//! cycle. engine -> phases -> phase, host -> ledger -> files, undo above
//! what it undoes.

use std::path::Path;

#[test]
fn no_module_imports_one_above_it() {
    knit_test_support::layers::assert_no_cycles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
