# shellcheck shell=sh
# Gives a guest a new host name. Run by the guest's own shell: through ECS's
# Cloud Assistant, the QEMU guest agent, or nsenter on the local cloud. The
# values come as single-quoted assignments before this text
# (knit_api::shell::guest_hostname), never spliced into it:
#   name  the new host name
#   live  the running host name: `required` (hostnamectl, else hostname;
#         failing is an error), `try` (the same; failing is a warning, as
#         /etc/hostname applies at the next start) or `skip` (the caller
#         sets it, as the local cloud does with sethostname)
#   ip    when not empty, /etc/hosts gets the line `ip<TAB>name` in place
#         of `ip<TAB>old` (and of an earlier `ip<TAB>name`)
#   old   the previous host name
#   root  prefix of /etc: empty in a guest, a scratch directory in tests
# The files are written with builtins only: a local cloud image may hold
# little more than a shell.
set -e
: "${name:?}" "${live:?}"
ip=${ip-} old=${old-} root=${root-}
case $live in
required | try | skip) ;;
*)
    echo "live must be required, try or skip, not $live" >&2
    exit 2
    ;;
esac
printf '%s\n' "$name" >"$root/etc/hostname"
if [ -n "$ip" ]; then
    tab=$(printf '\t')
    keep=
    if [ -e "$root/etc/hosts" ]; then
        keep=$(while IFS= read -r l || [ -n "$l" ]; do
            case "$l" in "$ip$tab$old" | "$ip$tab$name") ;; *) printf '%s\n' "$l" ;; esac
        done <"$root/etc/hosts")
    fi
    {
        if [ -n "$keep" ]; then printf '%s\n' "$keep"; fi
        printf '%s\t%s\n' "$ip" "$name"
    } >"$root/etc/hosts"
fi
if [ "$live" = skip ]; then exit 0; fi
if command -v hostnamectl >/dev/null 2>&1 && hostnamectl set-hostname "$name" 2>/dev/null; then
    exit 0
fi
if [ "$live" = required ]; then exec hostname "$name"; fi
hostname "$name" 2>/dev/null ||
    echo "/etc/hostname says $name; the running host name changes at the next start" >&2
