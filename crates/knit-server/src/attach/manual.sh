#!/bin/bash
# knit: add this machine to a node pool (manual mode). Its OS and its own
# user data stay as they are.
set -euo pipefail
# Filled in by the control plane, each value one single-quoted word.
base=@BASE_URL@
sha=@AGENT_SHA256@
pin=@CA_PIN@
ca_pem=@CA_PEM@
dir=@BOOTSTRAP_DIR@
state_dir=@STATE_DIR@
error_msg=@ERROR_MSG_FILE@
# Until the token is spent everything lives in a scratch directory; what
# this command adds to the machine goes again if it fails. A machine that
# already is a node (a second run) keeps its files.
state_existed=0
[ -e "$state_dir" ] && state_existed=1
dir_existed=0
[ -e "$dir" ] && dir_existed=1
work=$(mktemp -d)
chmod 700 "$work"
ok=0
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    rm -rf "$work"
    [ "$ok" = 1 ] && return
    cd /
    [ "$dir_existed" = 1 ] || rm -rf "$dir"
    [ "$state_existed" = 1 ] || rm -rf "$state_dir"
}
trap cleanup EXIT
printf '%s\n' "$ca_pem" > "$work/control-plane-ca.pem"
# The CA pin: the certificate carried above must be the control plane's.
got=$(sed '/-----/d' "$work/control-plane-ca.pem" | base64 -d | sha256sum | cut -d' ' -f1)
if [ "$got" != "$pin" ]; then
    echo "knit: the control-plane CA in this command does not match its pin sha256:$pin (damaged paste?)" >&2
    exit 1
fi
# Machine-side preflight.
fail=0
if [ -n "$(tail -n +2 /proc/swaps 2>/dev/null)" ]; then
    echo "knit preflight [PreflightSwapOn]: swap is on; the kubelet refuses to run with swap. Fix: swapoff -a and remove swap from /etc/fstab" >&2
    fail=1
fi
os_id=; os_version=; os_name=
if [ -r /etc/os-release ]; then
    # shellcheck disable=SC1091 # the machine's own file, read at run time
    os_id=$(. /etc/os-release; echo "${ID:-}")
    # shellcheck disable=SC1091
    os_version=$(. /etc/os-release; echo "${VERSION_ID:-}")
    # shellcheck disable=SC1091
    os_name=$(. /etc/os-release; echo "${PRETTY_NAME:-}")
fi
case "$os_id" in
    lifsea|*containeros*|*windows*)
        echo "knit preflight [PreflightOsNotAllowed]: $os_name cannot be added manually. Fix: use automatic mode (knit attach)" >&2
        fail=1;;
esac
[ "$fail" = 0 ] || exit 1
ca="$work/control-plane-ca.pem"
fetch() { curl -fsS --retry 10 --retry-delay 1 --retry-all-errors --connect-timeout 5 --cacert "$ca" "$@"; }
fetch -o "$work/knit-agent.part" "$base/mirror/bin/knit-agent"
if ! echo "$sha  $work/knit-agent.part" | sha256sum -c --status -; then
    echo "knit: knit-agent from $base/mirror/bin/knit-agent does not match sha256 $sha" >&2
    exit 1
fi
chmod 755 "$work/knit-agent.part"
mv "$work/knit-agent.part" "$work/knit-agent"
umask 077
swap=false
esc() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
facts="{\"osId\":\"$(esc "$os_id")\",\"osVersion\":\"$(esc "$os_version")\",\"osName\":\"$(esc "$os_name")\",\"swap\":$swap}"
# Bearer tokens reach curl in a mode-0600 file (umask 077 above), never on
# its command line, which every local user can read in /proc/*/cmdline;
# printf is a shell builtin, so no process carries the token either.
auth="$work/auth.header"
bearer() { printf 'Authorization: Bearer %s\n' "$1" > "$auth"; }
bearer @TOKEN@
# Server-side preflight; the answer is a one-time join token for this machine.
code=$(curl -sS --connect-timeout 5 --cacert "$work/control-plane-ca.pem" -o "$work/attach-answer" -w '%{http_code}' \
    -X POST -H @"$auth" -H 'Content-Type: application/json' --data "$facts" "$base/attach/v1/manual") || {
    echo "knit: cannot reach the control plane at $base: check connectivity and the security-group rules (egress TCP to that address)" >&2
    exit 1
}
if [ "$code" != 200 ]; then
    echo "knit: the control plane refused (HTTP $code):" >&2
    cat "$work/attach-answer" >&2
    echo >&2
    exit 1
fi
join_token=$(cat "$work/attach-answer")
rm -f "$work/attach-answer"
mkdir -p "$dir"
chmod 700 "$dir"
mv -f "$work/control-plane-ca.pem" "$work/knit-agent" "$dir/"
ca="$dir/control-plane-ca.pem"
# From here the token is spent and the machine is in the pool: a failure
# undoes the agent's work, tells the control plane, and says how to retry.
rollback() {
    why="$1"
    echo "knit: $why" >&2
    if [ -s "$error_msg" ]; then
        why="$why: $(head -c 1500 "$error_msg")"
    fi
    undone="this machine is back as it was before the command"
    if [ -x "$dir/knit-agent" ]; then
        echo "knit: undoing what the agent did here (services, mounts, files it wrote); the machine's own files are kept" >&2
        # On a partial undo the agent and its ledger stay, to run it again.
        "$dir/knit-agent" reset --undo >&2 \
            || { undone="some of the agent's changes could not be undone (listed above; run $dir/knit-agent reset --undo again)"; ok=1; }
    fi
    report_token=$(sed -n 's/^  reportToken: *//p' "$dir/node-config.yaml" 2>/dev/null | tr -d "'\"" | head -n 1) \
        || report_token=
    diag=
    if [ -n "$report_token" ]; then
        bearer "$report_token"
        diag=$(curl -sS --connect-timeout 5 --max-time 30 --cacert "$dir/control-plane-ca.pem" -X POST \
            -H @"$auth" -H 'Content-Type: text/plain' --data-binary "$why" \
            "$base/attach/v1/failed" 2>/dev/null) || diag=
    fi
    if [ -n "$diag" ]; then
        echo "knit: $diag" >&2
    else
        echo "knit: the control plane ($base) could not be told. Check connectivity between this machine and the control plane and the API server, and its security-group rules (egress TCP 7443 and 6443 to that address)" >&2
    fi
    echo "knit: $undone. The command's token is spent: to retry, fix the cause, make a new command (knit attach-script --pool POOL) and run it here" >&2
    exit 1
}
bearer "$join_token"
fetch -X POST -H @"$auth" -o "$dir/node-config.yaml" "$base/bootstrap/v1/config" \
    || rollback "cannot fetch this machine's NodeConfig from $base"
if "$dir/knit-agent" init --config "$dir/node-config.yaml"; then
    ok=1
    exit 0
fi
rollback "the agent could not join this machine to the cluster"
