#!/usr/bin/env bash
# Test doubles and fault hooks stay out of the product. The features that
# carry them (knit-ecs `fake`, knit-db `testing`, `fault-injection` of
# knit-local, knit-server and knit-agent) are turned on only by
# dev-dependencies: the release build (scripts/up.sh: no dev-dependencies)
# must resolve none of them, for any package of the workspace, and the
# test build (dev-dependencies) must resolve every one, so that the end-to-
# end tests' binaries have the hooks and this check can fail both ways.
# Resolves features only (cargo tree); builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

pattern='^knit-(ecs feature "fake"|db feature "testing"|(local|server|agent) feature "fault-injection")'
expected=5

# The test-only features `cargo tree` resolves over these dependency kinds.
resolved() {
    cargo tree --locked --workspace --edges "$1" --prefix none \
        | sed 's/ (\*)$//' | grep -E "$pattern" | sort -u || true
}

release=$(resolved normal,build,features)
if [ -n "$release" ]; then
    echo "release-features: the release build turns on test-only features:" >&2
    echo "$release" >&2
    echo "(a [dependencies] entry enables them; only [dev-dependencies] may)" >&2
    exit 1
fi

tests=$(resolved all,features)
found=$(printf '%s\n' "$tests" | grep -c . || true)
if [ "$found" -ne "$expected" ]; then
    echo "release-features: the test build turns on $found of the $expected test-only features:" >&2
    echo "$tests" >&2
    exit 1
fi
echo "release-features: none of the $expected test-only features in the release build; all in the test build"
