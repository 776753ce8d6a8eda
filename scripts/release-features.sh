#!/usr/bin/env bash
# Test doubles and fault hooks stay out of the product. The features that
# carry them (knit-ecs `fake`, knit-db `testing`, `fault-injection` of
# knit-local, knit-server and knit-agent) are turned on only by
# dev-dependencies: the release build (scripts/up.sh: no dev-dependencies)
# must resolve none of them, for any package of the workspace, and the
# test build (dev-dependencies) must resolve every one, so that the end-to-
# end tests' binaries have the hooks and this check can fail both ways.
# Also: scripts/up.sh's build leaves out the optional providers and
# datastores (below). Resolves features only (cargo tree); builds nothing.
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

# The main job's build (scripts/up.sh: --no-default-features) leaves out
# what it does not run (the features ecs, qemu, postgres, external-cluster
# of knit-cli and knit-server): none of these crates may resolve there — a
# dependency made non-optional would silently add its compile time back —
# and every one must in the default build (the tests, the Debian package).
optional='^(knit-ecs|knit-qemu|tokio-postgres|kube|k8s-openapi) v'
main_job=$(cargo tree --locked --edges normal,build --prefix none --no-default-features \
        -p knit-cli -p knit-agent -p knit-local -p knit-kubelet-sim \
    | sed 's/ (\*)$//' | grep -E "$optional" | cut -d' ' -f1 | sort -u || true)
if [ -n "$main_job" ]; then
    echo "release-features: scripts/up.sh's build (--no-default-features) resolves what it should leave out:" >&2
    echo "$main_job" >&2
    echo "(make the dependency optional, behind its feature: docs/architecture.md, \"Features: what the main job leaves out\")" >&2
    exit 1
fi
full=$(cargo tree --locked --edges normal,build --prefix none -p knit-cli \
    | sed 's/ (\*)$//' | grep -E "$optional" | cut -d' ' -f1 | sort -u | grep -c . || true)
if [ "$full" -ne 5 ]; then
    echo "release-features: the default build of knit resolves $full of knit-ecs, knit-qemu, tokio-postgres, kube, k8s-openapi (want all 5)" >&2
    exit 1
fi
echo "release-features: scripts/up.sh's knit leaves out ECS, QEMU, PostgreSQL and kube; the default build has them"
