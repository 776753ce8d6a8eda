# shellcheck shell=sh
# A command inside an ECS instance through Cloud Assistant, ended by
# `timeout -s KILL` after `secs`. Its streams go to files in a new
# directory; the first output line is `knit-exec <status> <stdout bytes>
# <stderr bytes> <directory>`, then, when both streams together are at most
# `inline` bytes, each base64 on a line of its own (and the directory is
# removed); larger ones are read in chunks afterwards. Values come as
# single-quoted assignments before this text, the command as `set -- …`:
#   secs    the command's time limit
#   inline  the most output bytes sent back in this answer
: "${secs:?}" "${inline:?}"
d=$(mktemp -d "${TMPDIR:-/tmp}/knit-exec.XXXXXX") || exit 125
timeout -s KILL "$secs" "$@" </dev/null >"$d/out" 2>"$d/err"
s=$?
o=$(wc -c <"$d/out")
e=$(wc -c <"$d/err")
echo "knit-exec $s $((o)) $((e)) $d"
if [ $((o + e)) -le "$inline" ]; then
    base64 -w0 "$d/out"
    echo
    base64 -w0 "$d/err"
    echo
    rm -rf "$d"
fi
