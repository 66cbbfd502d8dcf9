#!/usr/bin/env bash
# benches/kafka-streams/failover.sh: how long a partition is dark after a SIGKILL, kstate against
# Kafka Streams on one broker.
#
# For each system in turn:
#   1. two copies of the count-by-key application (kstate: examples/count_by_key; Kafka Streams:
#      this folder's jar in `serve` mode, caching off) in one group, each with its own state dir,
#      process an input of FAILOVER_ROWS unique keys of FAILOVER_KEY_BYTES bytes over
#      FAILOVER_PARTITIONS partitions: about FAILOVER_ROWS * FAILOVER_KEY_BYTES / 2 bytes of state
#      per copy (4,000,000 x 512 B: about 1 GB), no standby replicas;
#   2. once every input record has its output (and a few seconds for the last commits), copy A
#      is SIGKILLed (`e2e failover`), and one marker record is written to every input partition;
#   3. the result is the seconds from the kill until the marker of every partition has its
#      output: group detection (both systems' consumers get session.timeout.ms=SESSION_TIMEOUT_MS,
#      heartbeat.interval.ms=HEARTBEAT_MS), the survivor's restore of the moved partitions from
#      their changelogs, and processing the marker.
# The last line:
#   failover kafka-streams=<s>s kstate=<s>s ratio=<kafka-streams/kstate>
# and before it, per system, where the time went (from the survivor's restore lines):
#   failover-detail system=<s> seconds=<s> until_first_restore_s=<s> restore_s=<s> restored=<n> state_bytes=<b>
#
# Environment: KAFKA_BOOTSTRAP_SERVERS (else scripts/kafka start), FAILOVER_ROWS (4000000),
# FAILOVER_KEY_BYTES (512), FAILOVER_PARTITIONS (8), SESSION_TIMEOUT_MS (6000), HEARTBEAT_MS
# (500), FAILOVER_SYSTEMS (default "kafka-streams kstate"; one of them prints no comparison), KS_JAVA_OPTS, KSTATE_BIN_DIR (default $HOME/.cache/kstate-target/release/examples),
# KEEP_TOPICS=1, LOG_DIR (default a new temp dir, kept; the state dirs under it are removed).
set -euo pipefail

SCRIPT_NAME=failover.sh
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN_DIR=${KSTATE_BIN_DIR:-$HOME/.cache/kstate-target/release/examples}
E2E_BIN=$BIN_DIR/e2e
COUNT_BIN=$BIN_DIR/count_by_key
ROWS=${FAILOVER_ROWS:-4000000}
ROWS=${ROWS//_/}
KEY_BYTES=${FAILOVER_KEY_BYTES:-512}
PARTITIONS=${FAILOVER_PARTITIONS:-8}
SESSION_TIMEOUT_MS=${SESSION_TIMEOUT_MS:-6000}
HEARTBEAT_MS=${HEARTBEAT_MS:-500}
APP=kstate-failover-$(date +%s)-$$
read -r -a JAVA_OPTS <<<"${KS_JAVA_OPTS:-}"

[[ $ROWS =~ ^[1-9][0-9]*$ ]] || die "FAILOVER_ROWS must be a positive whole number (got '$ROWS')"
for bin in "$E2E_BIN" "$COUNT_BIN"; do
    [[ -x $bin ]] || die "$bin is missing; build it with:
  cd $ROOT && CARGO_TARGET_DIR=\$HOME/.cache/kstate-target cargo build --release --workspace --all-targets"
done
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/kstate-failover.XXXXXX")}
mkdir -p "$LOG_DIR"

ensure_jar "$LOG_DIR/mvn.log"

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    rm -rf "$LOG_DIR"/state-*
    stop_started_broker
}
trap cleanup EXIT
broker_up
e2e() { KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP "$E2E_BIN" "$@"; }
log "broker $BOOTSTRAP; $ROWS keys of $KEY_BYTES bytes over $PARTITIONS partitions; logs in $LOG_DIR"

INPUT=$APP-in
e2e setup --input "$INPUT" --partitions "$PARTITIONS" --rows "$ROWS" --unique --key-bytes "$KEY_BYTES" \
    2>&1 | tee "$LOG_DIR/setup.log" >&2
touch_lease

# Stamps every line with the wall clock in ms, so that restore lines can be set against the kill.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s%3N)" "$line"; done; }

# start SYSTEM COPY: starts one copy in the background; its pid goes into PIDS and $LAST_PID.
start() {
    local system=$1 copy=$2 app=$APP-$1 state=$LOG_DIR/state-$1-$2
    mkdir -p "$state"
    case $system in
    kafka-streams)
        java "${JAVA_OPTS[@]}" -jar "$JAR" serve --bootstrap "$BOOTSTRAP" --application-id "$app" \
            --input "$INPUT" --output "$app-out" --state-dir "$state" \
            --session-timeout-ms "$SESSION_TIMEOUT_MS" --heartbeat-interval-ms "$HEARTBEAT_MS" \
            > >(stamp >"$LOG_DIR/$system-$copy.log") 2>&1 &
        ;;
    kstate)
        KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP "$COUNT_BIN" --application-id "$app" --input "$INPUT" \
            --output "$app-out" --state-dir "$state" \
            --consumer-property "session.timeout.ms=$SESSION_TIMEOUT_MS" \
            --consumer-property "heartbeat.interval.ms=$HEARTBEAT_MS" \
            > >(stamp >"$LOG_DIR/$system-$copy.log") 2>&1 &
        ;;
    esac
    LAST_PID=$!
    PIDS+=("$LAST_PID")
}

# run SYSTEM: one failover of SYSTEM; prints its failover-detail line, sets SECONDS_<system>.
run() {
    local system=$1 app=$APP-$1
    e2e output --topic "$app-out" --partitions "$PARTITIONS"
    log "$system: two copies processing $ROWS records"
    start "$system" a
    local a=$LAST_PID
    start "$system" b
    local b=$LAST_PID
    e2e wait --output "$app-out" --records "$ROWS" --timeout-s 3600
    touch_lease
    sleep 5 # the last commits (100 ms interval on both)
    local state_bytes
    state_bytes=$(du -sb "$LOG_DIR/state-$system-a" | cut -f1)
    log "$system: copy a holds $state_bytes bytes of state; SIGKILL it"
    e2e failover --input "$INPUT" --output "$app-out" --kill "$a" --timeout-s 900 \
        --json "$LOG_DIR/$system-failover.json" | tee "$LOG_DIR/$system-failover.log" >&2
    kill -TERM "$b" 2>/dev/null || true
    for _ in $(seq 120); do kill -0 "$b" 2>/dev/null || break; sleep 1; done
    kill -KILL "$b" 2>/dev/null || true
    touch_lease
    local summary seconds killed_at
    summary=$(grep '^failover seconds=' "$LOG_DIR/$system-failover.log" | tail -n 1)
    [[ -n $summary ]] || die "$system: no failover line (see $LOG_DIR/$system-failover.log)"
    seconds=$(sed 's/.*seconds=\([0-9.]*\).*/\1/' <<<"$summary")
    killed_at=$(sed 's/.*killed_at_ms=\([0-9]*\).*/\1/' <<<"$summary")
    # The survivor's restore lines after the kill: kstate "count_by_key: restore(d) T/P ...",
    # Kafka Streams "kafka-streams serve: restore(d) T/P ...".
    awk -v since="$killed_at" -v sys="$system" -v seconds="$seconds" -v bytes="$state_bytes" '
        $1 >= since && / restore [^ ]+\/[0-9]+ from / { if (!first) first = $1 }
        $1 >= since && / restored [^ ]+\/[0-9]+ / {
            last = $1
            if (match($0, /\(([0-9]+) records\)/)) { n += substr($0, RSTART + 1, RLENGTH - 10) }
        }
        END {
            until_first = first ? (first - since) / 1000 : -1
            restore = (first && last) ? (last - first) / 1000 : -1
            printf "failover-detail system=%s seconds=%s until_first_restore_s=%.3f restore_s=%.3f restored=%d state_bytes=%s\n", sys, seconds, until_first, restore, n, bytes
        }' "$LOG_DIR/$system-b.log" | tee -a "$LOG_DIR/details"
    printf -v "SECONDS_${system//-/_}" '%s' "$seconds"
    rm -rf "$LOG_DIR/state-$system-a" "$LOG_DIR/state-$system-b"
}

SYSTEMS=${FAILOVER_SYSTEMS:-kafka-streams kstate}
for system in $SYSTEMS; do run "$system"; done
[[ $SYSTEMS == *kafka-streams* && $SYSTEMS == *kstate* ]] || exit 0

if [[ ${KEEP_TOPICS:-0} == 0 ]]; then
    for topic in "$INPUT" "$APP-kafka-streams-out" "$APP-kstate-out" \
        "$APP-kafka-streams-counts-changelog" "$APP-kstate-counts-changelog"; do
        "$KAFKA_SCRIPT" run-class org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" \
            --delete --if-exists --topic "$topic" >/dev/null 2>&1 || log "could not delete $topic"
    done
fi

echo "failover kafka-streams=${SECONDS_kafka_streams}s kstate=${SECONDS_kstate}s" \
    "ratio=$(awk -v a="$SECONDS_kafka_streams" -v b="$SECONDS_kstate" 'BEGIN { printf "%.2f", a / b }')"
