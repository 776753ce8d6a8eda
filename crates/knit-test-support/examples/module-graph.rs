//! Prints a crate's module import graph and its cycles:
//! `cargo run -q -p knit-test-support --example module-graph -- crates/knit-agent/src [--files]`
//! (`--files`: one node per file module instead of per top-level room).

use knit_test_support::layers::{cycles, describe, read, strongly_connected, Grain};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(src) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: module-graph <crate>/src [--files]");
        return ExitCode::from(2);
    };
    let grain = if args.iter().any(|a| a == "--files") {
        Grain::File
    } else {
        Grain::TopLevel
    };
    let graph = match read(&PathBuf::from(src), grain) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{} modules, {} edges",
        graph.modules.len(),
        graph.edges.len()
    );
    for e in &graph.edges {
        println!(
            "  {} -> {}  (src/{}:{} {})",
            e.from, e.to, e.file, e.line, e.path
        );
    }
    for scc in strongly_connected(&graph).iter().filter(|s| s.len() > 1) {
        let names: Vec<&str> = scc.iter().map(String::as_str).collect();
        println!(
            "strongly connected, {} modules: {}",
            scc.len(),
            names.join(", ")
        );
    }
    let found = cycles(&graph);
    println!("{} cycle(s)", found.len());
    for c in &found {
        println!("  {}", describe(c));
    }
    ExitCode::SUCCESS
}
