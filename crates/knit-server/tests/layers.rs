//! The control plane's rooms import only rooms below them
//! (docs/architecture.md, "Inside the control plane"): the module graph
//! read from `src/` has no cycle. A new upward import fails, naming the
//! cycle it makes and the lines that tie it.
//!
//! And the crate shows other crates only its public face: the rooms and
//! the re-exported items lib.rs makes `pub` are exactly the lists below,
//! so a new room is sealed (`pub(crate)`) unless the face is widened here
//! on purpose.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The rooms other crates may name (`knit server`, the CLI, the tests, the
/// bench); every other room is `pub(crate)`.
const PUBLIC_ROOMS: &[&str] = &[
    "autoscaler",
    "features",
    "join",
    "mirror",
    "preflight",
    "provider",
    "sealed",
    "store",
];

/// The items of sealed rooms that lib.rs re-exports, by the names other
/// crates see.
const PUBLIC_ITEMS: &[&str] = &[
    "ClusterJoin",
    "ConnectionLimits",
    "ConsoleSettings",
    "ControlPlane",
    "DEFAULT_CONSOLE_PORT",
    "DEFAULT_PORT",
    "DrainProgress",
    "EmbeddedJoin",
    "ExternalJoin",
    "JoinMaterial",
    "NoCluster",
    "Result",
    "Server",
    "ServerError",
    "Settings",
    "USER_DATA_RESULT",
    "USER_DATA_RESULT_MAX_BYTES",
    "advertise_host",
    "ensure_registry_layout",
    "init_state",
    "reconcile_plan",
    "route_table",
    "start",
    "start_kube_events",
    "stored_cluster",
    "token_hash",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_module_imports_one_above_it() {
    knit_test_support::layers::assert_no_cycles(&src());
}

/// `text` with its line comments cut off.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// lib.rs without its comments.
fn lib_code() -> String {
    without_comments(&std::fs::read_to_string(src().join("lib.rs")).expect("read src/lib.rs"))
}

/// The modules lib.rs declares, each with whether other crates see it
/// (`pub mod`) or not (`mod`, `pub(crate) mod`, `pub(super) mod` …).
fn root_modules(code: &str) -> Vec<(String, bool)> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim();
            let (public, rest) = if let Some(rest) = line.strip_prefix("pub mod ") {
                (true, rest)
            } else if let Some(rest) = line.strip_prefix("mod ") {
                (false, rest)
            } else {
                (false, line.strip_prefix("pub(")?.split_once(") mod ")?.1)
            };
            Some((rest.trim_end_matches([';', '{', ' ']).to_string(), public))
        })
        .collect()
}

/// The names lib.rs's `pub use` trees give other crates: each leaf's last
/// path segment, or the name after its `as`.
fn root_reexports(code: &str) -> BTreeSet<String> {
    code.split(';')
        .filter_map(|statement| statement.split_once("pub use ").map(|(_, tree)| tree))
        .flat_map(|tree| tree.split([',', '{', '}']))
        .map(str::trim)
        // Empty between braces, or a prefix that a `{` follows.
        .filter(|leaf| !leaf.is_empty() && !leaf.ends_with("::"))
        .map(|leaf| match leaf.split_once(" as ") {
            Some((_, name)) => name.trim().to_string(),
            None => leaf.rsplit("::").next().unwrap_or(leaf).to_string(),
        })
        .collect()
}

/// The rooms in `src/`: each `<name>.rs` and `<name>/` but lib.rs.
fn rooms_on_disk() -> BTreeSet<String> {
    std::fs::read_dir(src())
        .expect("list src/")
        .map(|entry| entry.expect("read src/ entry").path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            if path.is_dir() {
                Some(name.to_string())
            } else {
                name.strip_suffix(".rs").map(str::to_string)
            }
        })
        .filter(|name| name != "lib")
        .collect()
}

#[test]
fn other_crates_see_only_the_documented_face() {
    let code = lib_code();
    let modules = root_modules(&code);
    let declared: BTreeSet<String> = modules.iter().map(|(name, _)| name.clone()).collect();
    // Every room read from lib.rs, so that a room the reading missed
    // cannot slip past the check below.
    assert_eq!(
        declared,
        rooms_on_disk(),
        "the rooms lib.rs declares are not the rooms in src/"
    );
    let public: BTreeSet<&str> = modules
        .iter()
        .filter(|(_, public)| *public)
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        public,
        PUBLIC_ROOMS.iter().copied().collect::<BTreeSet<_>>(),
        "lib.rs's `pub mod`s are not the public face: seal a new room with \
         `pub(crate) mod`, or widen PUBLIC_ROOMS and docs/architecture.md on purpose"
    );
    assert_eq!(
        root_reexports(&code),
        PUBLIC_ITEMS
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>(),
        "lib.rs's `pub use`s are not the public face: widen PUBLIC_ITEMS and \
         docs/architecture.md on purpose"
    );
}

#[test]
fn the_face_reading_finds_sealed_rooms_and_renamed_items() {
    let code = without_comments(
        "pub mod open;\npub(crate) mod sealed;\nmod private;\n\
         pub use a::{b::C, d as e};\npub use f::G; // pub use h::I;",
    );
    assert_eq!(
        root_modules(&code),
        [("open", true), ("sealed", false), ("private", false)]
            .map(|(name, public)| (name.to_string(), public))
    );
    assert_eq!(
        root_reexports(&code),
        ["C", "G", "e"]
            .map(str::to_string)
            .into_iter()
            .collect::<BTreeSet<_>>()
    );
}
