#!/bin/bash
# knit initialization: fetch knit-agent from the package mirror (or find it
# preloaded in the image), verify its sha256, exchange the one-time token for this instance's NodeConfig, run it.
# Every transfer is retried: a control plane restarting mid-download must not
# leave the instance uninitialized.
#
# The control plane puts the values above this text (shell-quoted
# assignments): dir, mirror, agent_sha256, bootstrap_url, join_token, ca_pem.
set -euo pipefail
: "${dir:?}" "${mirror:?}" "${agent_sha256:?}" "${bootstrap_url:?}" "${join_token:?}" "${ca_pem:?}"
mkdir -p "$dir"
chmod 700 "$dir"
printf '%s\n' "$ca_pem" > "$dir/control-plane-ca.pem"
fetch() { curl -fsS --retry 10 --retry-delay 1 --retry-all-errors --connect-timeout 5 --cacert "$dir/control-plane-ca.pem" "$@"; }
# An image preloaded with this very agent (`knit image preload`) runs it
# where it is: nothing fetched, nothing written.
preloaded=/usr/local/bin/knit-agent
if [ -x "$preloaded" ] && echo "$agent_sha256  $preloaded" | sha256sum -c --status - 2>/dev/null; then
    ln -sfn "$preloaded" "$dir/knit-agent"
else
    fetch -o "$dir/knit-agent.part" "$mirror/bin/knit-agent"
    if ! echo "$agent_sha256  $dir/knit-agent.part" | sha256sum -c --status -; then
        echo "knit: knit-agent from $mirror/bin/knit-agent does not match sha256 $agent_sha256" >&2
        exit 1
    fi
    chmod 755 "$dir/knit-agent.part"
    mv "$dir/knit-agent.part" "$dir/knit-agent"
fi
umask 077
# The token reaches curl in a mode-0600 file, never on a command line
# (/proc/*/cmdline is readable by every local user); printf is a builtin.
printf 'Authorization: Bearer %s\n' "$join_token" > "$dir/join-token.header"
fetch -X POST -H @"$dir/join-token.header" -o "$dir/node-config.yaml" "$bootstrap_url"
rm -f "$dir/join-token.header"
"$dir/knit-agent" init --config "$dir/node-config.yaml"
