# shellcheck shell=sh
# One chunk of a regular file inside an ECS instance, base64 on one line,
# sent through Cloud Assistant (whose output limit is why files come in
# chunks). Values come as single-quoted assignments before this text:
#   file   the file's path
#   secs   dd's time limit inside the instance
#   chunk  the chunk's size in bytes
#   index  which chunk (from 0)
: "${file:?}" "${secs:?}" "${chunk:?}" "${index:?}"
if [ ! -f "$file" ] || [ ! -r "$file" ]; then
    echo "not a readable regular file"
    exit 3
fi
timeout -s KILL "$secs" dd if="$file" bs="$chunk" skip="$index" count=1 2>/dev/null | base64 -w0
