# shellcheck shell=sh
# `systemctl <verb>` two seconds after this script returns, run by the
# guest agent, so that the agent answers before the guest goes down. The
# value comes as a single-quoted assignment before this text:
#   verb  poweroff or reboot
: "${verb:?}"
(
    sleep 2
    systemctl "$verb"
) </dev/null >/dev/null 2>&1 &
