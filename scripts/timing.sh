# Sourced by demo.sh and test.sh: when the script ends, one line on stderr with how long it
# took, on how many cores and under what load (a script's time says little without them:
# the demo takes about 5 minutes on an idle 2-core machine and 12 at load 8).
#   source scripts/timing.sh NAME     (another EXIT trap: trap 'rc=$?; ...; timing_report "$rc"' EXIT)
timing_name="$1"
timing_start=$SECONDS
timing_load_start="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')"
timing_report() {
    local rc=${1:-$?} took=$((SECONDS - timing_start)) load_end
    load_end="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')"
    printf '%s: %s after %dm%02ds on %s cores (load average %s at the start, %s at the end)\n' \
        "$timing_name" "$([ "$rc" -eq 0 ] && echo finished || echo "failed (exit $rc)")" \
        $((took / 60)) $((took % 60)) "$(nproc 2>/dev/null || echo '?')" "$timing_load_start" "$load_end" >&2
    return "$rc"
}
trap timing_report EXIT
