#!/bin/sh
# knit: put a manual-mode machine leaving its pool back as it was before its
# attach command. Safe to run twice (a server that died half way runs it
# again): with the agent and its ledger gone there is nothing left to undo.
set -u
# Filled in by the control plane, each value one single-quoted word.
dir=@BOOTSTRAP_DIR@
agent=@AGENT@
state_dir=@STATE_DIR@
if [ -x "$agent" ]; then
    if "$agent" leave --help >/dev/null 2>&1; then
        # The agent undoes its changes from its ledger and removes its
        # files; its report (JSON) goes to stdout.
        exec "$agent" leave
    fi
    # An agent from before `knit-agent leave`: its undo, then its files.
    "$agent" reset --undo || exit $?
elif [ -e "$state_dir/undo/ledger.json" ]; then
    echo "the agent's undo ledger is there but $agent is gone: nothing can undo its changes" >&2
    exit 3
fi
rm -rf "$dir"
rmdir "$state_dir" 2>/dev/null || true
exit 0
