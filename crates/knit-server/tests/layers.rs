//! The control plane's rooms import only rooms below them
//! (docs/architecture.md, "Inside the control plane"), except for the
//! cycles listed here, still to be broken (issue 26 item 2): a new upward
//! import that ties another room into one of them, or a new cycle, fails,
//! naming it. Shrink the list as they go.

use std::path::Path;

#[test]
fn no_module_imports_one_above_it_beyond_the_known_cycles() {
    knit_test_support::layers::assert_cycles_within(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &[
            // ServerError carries ProviderError; the instance-type fallback
            // reads the store.
            &["error", "provider", "store"],
            // Pool rules, the rollout and the drain share counts and hashes.
            &["drain", "pools", "reconcile"],
        ],
    );
}
