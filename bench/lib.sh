# shellcheck shell=bash
# Sourced by the benchmarks (issue 31 item 6): every process a bench starts
# is ended by the bench, by its recorded PID, and the bench fails when
# anything it started is still running at its end.
#
#   bench_track PID WORD   record PID (its start time, read now, and a word
#                          its command line must hold when it is signalled;
#                          call it right after `cmd &`, before cmd's exec the
#                          command line is still bash's)
#   bench_track_up CONFIG  record the server `knit up` started (the pid in
#                          the client config it wrote)
#   bench_end_all [GRACE]  SIGTERM to every recorded process still ours,
#                          SIGKILL after GRACE seconds (default 10)
#   bench_left WORD…       print every recorded process still ours and every
#                          process whose command line holds one of the words
#                          (the run's work directory); return 1 if any
#   bench_session CMD…     run CMD in the foreground in a session of its own,
#                          then fail if any process of that session is left
#   bench_free_port        a TCP port free on loopback now
#
# A PID is ours while its start time is the recorded one and its command
# line holds the recorded word, so a recycled PID is never signalled.

BENCH_PIDS=()
declare -A BENCH_START=() BENCH_WORD=()

# Field N (1-based, N >= 3) of /proc/PID/stat, past the command name (which
# may hold spaces and parentheses).
bench_stat_field() {
    local stat fields
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    read -ra fields <<<"${stat##*) }"
    echo "${fields[$(($2 - 3))]}"
}

bench_cmdline() {
    tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline"
}

bench_track() {
    local start
    start=$(bench_stat_field "$1" 22) || {
        echo "bench_track: process $1 is not running" >&2
        return 1
    }
    BENCH_PIDS+=("$1")
    BENCH_START[$1]=$start
    BENCH_WORD[$1]=$2
}

bench_track_up() {
    local pid
    pid=$(sed -n 's/^pid: *\([0-9][0-9]*\) *$/\1/p' "$1")
    if [ -z "$pid" ]; then
        echo "bench_track_up: no pid in $1" >&2
        return 1
    fi
    bench_track "$pid" server
}

bench_ours() {
    local start
    start=$(bench_stat_field "$1" 22) || return 1
    [ "$start" = "${BENCH_START[$1]}" ] && bench_cmdline "$1" | grep -qF -- "${BENCH_WORD[$1]}"
}

bench_end_all() {
    local grace=${1:-10} pid deadline
    for pid in "${BENCH_PIDS[@]}"; do
        if bench_ours "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
    done
    deadline=$((SECONDS + grace))
    for pid in "${BENCH_PIDS[@]}"; do
        while bench_ours "$pid" && [ "$(bench_stat_field "$pid" 3)" != Z ] && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.1
        done
        if bench_ours "$pid" && [ "$(bench_stat_field "$pid" 3)" != Z ]; then
            echo "bench: process $pid ($(bench_cmdline "$pid")) ignored SIGTERM for ${grace} s: SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        # Reaps it when it is this shell's child (a zombie is not "left").
        wait "$pid" 2>/dev/null || true
    done
}

bench_left() {
    local pid p left=0 word cmd
    local -A seen=()
    for pid in "${BENCH_PIDS[@]}"; do
        if bench_ours "$pid" && [ "$(bench_stat_field "$pid" 3)" != Z ]; then
            echo "left running: pid $pid: $(bench_cmdline "$pid")" >&2
            seen[$pid]=1
            left=1
        fi
    done
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [ "$pid" = $$ ] || [ -n "${seen[$pid]:-}" ] && continue
        cmd=$(bench_cmdline "$pid") || continue
        for word in "$@"; do
            [ -n "$word" ] || continue
            case $cmd in
            *"$word"*)
                if [ "$(bench_stat_field "$pid" 3)" != Z ]; then
                    echo "left running: pid $pid: $cmd" >&2
                    seen[$pid]=1
                    left=1
                fi
                ;;
            esac
        done
    done
    return "$left"
}

bench_session() {
    local pid rc=0 p left=0
    setsid "$@" &
    pid=$!
    wait "$pid" || rc=$?
    # setsid(1) execs in place (a background job leads no process group),
    # so the command's PID is its session's ID.
    for p in /proc/[0-9]*; do
        if [ "$(bench_stat_field "${p#/proc/}" 6 2>/dev/null)" = "$pid" ]; then
            echo "left running after '$*': pid ${p#/proc/}: $(bench_cmdline "${p#/proc/}")" >&2
            left=1
        fi
    done
    if [ "$left" = 1 ] && [ "$rc" = 0 ]; then rc=1; fi
    return "$rc"
}

bench_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
