#!/usr/bin/env bash
# The one command that sets up and runs every test: unit, integration (real
# loop devices, mounts, namespaces) and end-to-end suites. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything the tests need, QEMU and --ha included (scripts/setup.sh --tests).
bash scripts/setup.sh --tests

echo "== format and lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The main job's knit (scripts/up.sh builds it with --no-default-features:
# no ECS, QEMU, PostgreSQL or external cluster) must build and lint clean
# too. Re-checks only the crates with such features (knit-db, knit-server,
# knit-cli and what depends on knit-db): about 30 s after the line above.
cargo clippy -p knit-cli --no-default-features --locked -- -D warnings

echo "== test-only features"
# The fake ECS, knit_db::testing and the fault hooks: all in the test
# build, none in the release build (resolves features; builds nothing).
bash scripts/release-features.sh

echo "== shellcheck"
# Every shell script in the repository, also those the server embeds
# (include_str!) and runs inside instances.
git ls-files -z '*.sh' | xargs -0 shellcheck

echo "== dependency policy"
# Licences, banned crates and duplicate versions, crate sources (deny.toml).
# Not advisories: the RustSec database is fetched from GitHub, which this
# machine cannot reach (README.md, "Dependency checks").
cargo deny --locked check licenses bans sources

echo "== build"
cargo build --workspace --all-targets --locked

echo "== node image"
# Sandboxes run on the node OS image: build it once (a no-op when the same
# packages and versions were built before).
target/debug/knit image build

echo "== tests"
# Tests that touch loop devices, mounts or namespaces create their own, with
# unique names, and remove them; they are safe to run in parallel.
cargo nextest run --workspace --locked --no-fail-fast
