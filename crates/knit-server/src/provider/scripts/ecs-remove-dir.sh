# shellcheck shell=sh
# Removes the output directory of an exec (ecs-exec.sh) once its streams
# were read. The value comes as a single-quoted assignment before this text:
#   dir  the directory
: "${dir:?}"
rm -rf "$dir"
