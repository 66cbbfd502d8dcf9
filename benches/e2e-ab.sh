#!/usr/bin/env bash
# benches/e2e-ab.sh OLD_E2E NEW_E2E: two builds of kstate's end-to-end runs (`e2e kstate`:
# kstate-bench's e2e binary, $CARGO_TARGET_DIR/release/e2e, built at two commits) on the same
# inputs, alternated run by run, so that a change is judged against the machine's noise of the
# same hour, not against a number from another day.
#
# Lines (LINES, default "alos eos windowed"): the count-by-key at-least-once and exactly-once
# (caching off) on one input of E2E_ROWS keyed records (E2E_PARTITIONS partitions, 10,000 keys),
# and the windowed count (`--topology windowed`: tumbling 1-minute windows, 10 s grace, every
# update sent, at-least-once) on a second input whose event time advances WINDOWED_STEP_MS per
# record with 2-minute bookends, as benches/kafka-streams/compare.sh's windowed part. Each input
# is written once; then ROUNDS rounds, each running OLD then NEW (NEW then OLD on even rounds)
# per line, each into a fresh LogAppendTime output topic measured by NEW's `e2e measure` (the
# rate between the first and the last output's broker append time; the windowed outputs checked
# against the input). Prints a line per run and, per line, the median rates and their ratio:
#   ab alos     old=<r>/s new=<r>/s new/old=<ratio> (runs: ...)
#   ab eos      old=<r>/s new=<r>/s new/old=<ratio> (runs: ...)
#   ab windowed old=<r>/s new=<r>/s new/old=<ratio> (runs: ...)
# Topics are deleted at the end. KAFKA_BOOTSTRAP_SERVERS names the broker (default: scripts/kafka
# start). Environment: E2E_ROWS (default 1000000), E2E_PARTITIONS (4), ROUNDS (3), LINES,
# WINDOWED_STEP_MS (1.2).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
old=${1:?usage: e2e-ab.sh OLD_E2E NEW_E2E}
new=${2:?usage: e2e-ab.sh OLD_E2E NEW_E2E}
rows=${E2E_ROWS:-1000000}
partitions=${E2E_PARTITIONS:-4}
rounds=${ROUNDS:-3}
read -r -a lines <<<"${LINES:-alos eos windowed}"
step_ms=${WINDOWED_STEP_MS:-1.2}
bootstrap=${KAFKA_BOOTSTRAP_SERVERS:-$("$here/../scripts/kafka" start | tail -n 1)}
export KAFKA_BOOTSTRAP_SERVERS=$bootstrap
run_id=ab-$(date +%s)-$$
input=$run_id-in
windowed_input=$run_id-win
topics=("$input")
log() { printf 'e2e-ab: %s\n' "$*" >&2; }
cleanup() {
    local IFS=,
    "$new" delete-topics --topics "${topics[*]}" >/dev/null 2>&1 || log "could not delete ${topics[*]}"
}
trap cleanup EXIT

log "$rows records into $input ($partitions partitions) on $bootstrap"
"$new" setup --input "$input" --partitions "$partitions" --rows "$rows" >&2
if [[ " ${lines[*]} " == *" windowed "* ]]; then
    log "$rows records into $windowed_input, event time $step_ms ms a record"
    topics+=("$windowed_input")
    "$new" setup --input "$windowed_input" --partitions "$partitions" --rows "$rows" \
        --event-time-step-ms "$step_ms" --event-time-bookends-ms 120000 >&2
fi
declare -A rates
n=0
for round in $(seq 1 "$rounds"); do
    order=(old new)
    ((round % 2 == 0)) && order=(new old)
    for line in "${lines[@]}"; do
        case $line in
            alos) guarantee=at-least-once from=$input kstate_args=() measure_args=(--expect records) ;;
            eos) guarantee=exactly-once from=$input kstate_args=() measure_args=(--expect records) ;;
            windowed)
                guarantee=at-least-once from=$windowed_input kstate_args=(--topology windowed)
                measure_args=(--expect window-updates --input "$windowed_input") ;;
            *) log "unknown line $line (alos, eos, windowed)"; exit 2 ;;
        esac
        for which in "${order[@]}"; do
            n=$((n + 1))
            bin=$old
            [[ $which == new ]] && bin=$new
            name=$run_id-$n
            out=$name-out
            topics+=("$out" "$name-counts-changelog")
            "$new" output --topic "$out" --partitions "$partitions" >&2
            "$bin" kstate --input "$from" --output "$out" --rows "$rows" \
                --application-id "$name" --guarantee "$guarantee" "${kstate_args[@]}" >&2
            rate=$("$new" measure --output "$out" --partitions "$partitions" --rows "$rows" \
                "${measure_args[@]}" | sed -n 's/^e2e output=.* records_per_sec=\([0-9]*\)$/\1/p')
            [[ -n $rate ]] || { log "no rate from the measure of $out"; exit 1; }
            echo "ab-run round=$round line=$line binary=$which records_per_sec=$rate"
            rates[$line/$which]+="$rate "
        done
    done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for line in "${lines[@]}"; do
    o=$(median <<<"${rates[$line/old]}")
    w=$(median <<<"${rates[$line/new]}")
    echo "ab $line old=$o/s new=$w/s new/old=$(awk -v a="$w" -v b="$o" 'BEGIN {printf "%.3f", a / b}') (runs: old ${rates[$line/old]}/ new ${rates[$line/new]})"
done
