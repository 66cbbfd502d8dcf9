#!/usr/bin/env bash
# benches/kafka-streams/failover.sh: how long a partition is dark after a SIGKILL, kstate against
# Kafka Streams on one broker. Two modes (FAILOVER_MODE):
#
# takeover (the default), at-least-once. For each system in turn:
#   1. two copies of the count-by-key application (kstate: kstate-bench's count_by_key; Kafka
#      Streams: this folder's jar in `serve` mode, caching off) in one group, each with its own state dir,
#      process an input of FAILOVER_ROWS unique keys of FAILOVER_KEY_BYTES bytes over
#      FAILOVER_PARTITIONS partitions: about FAILOVER_ROWS * FAILOVER_KEY_BYTES / 2 bytes of state
#      per copy (4,000,000 x 512 B: about 1 GB), no standby replicas;
#   2. once every input record has its output (and a few seconds for the last commits), copy A
#      is SIGKILLed (`e2e failover`), and one marker record is written to every input partition;
#   3. the result is the seconds from the kill until the marker of every partition has its
#      output: group detection (both systems' consumers get session.timeout.ms=SESSION_TIMEOUT_MS,
#      heartbeat.interval.ms=HEARTBEAT_MS), the survivor's restore of the moved partitions from
#      their changelogs, and processing the marker.
#   The last line:
#     failover kafka-streams=<s>s kstate=<s>s ratio=<kafka-streams/kstate>
#
# restart, exactly-once: recovery of one copy restarted after a SIGKILL. For each system in turn:
#   1. ONE copy of the count-by-key application, exactly-once (Kafka Streams: `serve --guarantee
#      exactly-once`, i.e. processing.guarantee=exactly_once_v2; kstate: count_by_key
#      --guarantee exactly-once --instance-id copy-a --threads 1), caching off, commit interval
#      100 ms, the same input: it holds all FAILOVER_ROWS keys (4,000,000 x 512 B: about 2 GB).
#      Both are static members of their group (group.instance.id: kstate `copy-a`, Kafka Streams
#      `copy-a-1`, as Streams suffixes the stream thread's index), so that the restarted copy
#      takes its old member's place and partitions at once instead of waiting for the killed
#      one's session (SESSION_TIMEOUT_MS, HEARTBEAT_MS as above) to expire;
#   2. once every input record was processed in a committed transaction (the output holds
#      FAILOVER_ROWS records and the group's committed offsets reached the input's end; then a
#      few seconds more, as above), `e2e failover` SIGKILLs the copy and writes the markers,
#      and the same copy (same names, same state dir) is started again as soon as the kill
#      landed, while the markers are written;
#   3. the result is the seconds from the kill until the marker of every partition has its
#      output (broker append time; read with isolation.level=read_committed): process start,
#      group rejoin, the restore, processing the marker. Kafka Streams under exactly_once_v2
#      finds no checkpoint after an unclean shutdown, wipes the task's stores and restores them
#      from the changelog from the start; kstate reopens its stores at the changelog offset
#      stored with the data and replays only the tail past it. The failover-detail line's
#      `restored` shows which happened.
#   The last line:
#     recovery-eos kafka-streams=<s>s kstate=<s>s ratio=<kafka-streams/kstate>
#
# FAILOVER_STANDBYS=1 (takeover mode): each copy keeps a standby replica of the other's tasks,
#   Kafka Streams with num.standby.replicas=1 (`serve --standby-replicas 1`), kstate with
#   `count_by_key --standby-replicas 1 --instance-id copy-COPY` (static members, the eager range
#   assignor, standbys where a failure sends each task); the last line is then
#     failover-standby kafka-streams=<s>s kstate=<s>s ratio=<kafka-streams/kstate>
#
# FAILOVER_DETECTION_MS=N (takeover mode, with FAILOVER_STANDBYS=1): kstate's copies also run
#   `--failure-detection-ms N` (liveness beacons; a copy silent for N ms is removed from the
#   group by the other, without waiting for its session timeout). Kafka Streams has no
#   counterpart and keeps waiting for the session timeout. The last line then ends with
#   `kstate_failure_detection_ms=N`.
#
# Before the last line, per system, where the time went (from the survivor's, or the restarted
# copy's, restore lines after the kill):
#   failover-detail system=<s> seconds=<s> until_first_restore_s=<s> restore_s=<s> restored=<n> state_bytes=<b>
# (state_bytes: `du` of the killed copy's state dir just before the kill; in restart mode the
# line ends with until_running_s=<s>: from the kill until the restarted copy said it runs, i.e.
# process start-up, a JVM's for Kafka Streams.)
#
# Environment: CLIENT_PROPERTIES (a librdkafka properties file for a secured broker, as in
# compare.sh: its bootstrap.servers is the broker, and every client of both systems gets it),
# KAFKA_BOOTSTRAP_SERVERS (else scripts/kafka start), FAILOVER_MODE (takeover |
# restart), FAILOVER_ROWS (4000000), FAILOVER_KEY_BYTES (512), FAILOVER_PARTITIONS (8),
# SESSION_TIMEOUT_MS (6000), HEARTBEAT_MS (500), FAILOVER_RESTORE_THREADS (kstate's restorer
# threads, one pool per process; default: the runtime's, as many as workers and at least 2),
# FAILOVER_SYSTEMS (default "kafka-streams kstate"; one of them prints no comparison),
# KS_JAVA_OPTS, KSTATE_BIN_DIR (the cargo release directory, default
# $HOME/.cache/kstate-target/release), KSTATE_E2E (kstate-bench's e2e binary, default
# KSTATE_BIN_DIR/e2e), KSTATE_COUNT_BY_KEY (kstate-bench's count_by_key service, default
# KSTATE_BIN_DIR/count_by_key),
# KEEP_TOPICS=1, LOG_DIR (default a new temp dir, kept; the state dirs under it are removed).
# Needs bash 5.1+ (`wait -n -p`) in restart mode.
set -euo pipefail

SCRIPT_NAME=failover.sh
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN_DIR=${KSTATE_BIN_DIR:-$HOME/.cache/kstate-target/release}
E2E_BIN=${KSTATE_E2E:-$BIN_DIR/e2e}
COUNT_BIN=${KSTATE_COUNT_BY_KEY:-$BIN_DIR/count_by_key}
ROWS=${FAILOVER_ROWS:-4000000}
ROWS=${ROWS//_/}
KEY_BYTES=${FAILOVER_KEY_BYTES:-512}
PARTITIONS=${FAILOVER_PARTITIONS:-8}
SESSION_TIMEOUT_MS=${SESSION_TIMEOUT_MS:-6000}
HEARTBEAT_MS=${HEARTBEAT_MS:-500}
MODE=${FAILOVER_MODE:-takeover}
STANDBYS=${FAILOVER_STANDBYS:-0}
DETECTION_MS=${FAILOVER_DETECTION_MS:-0}
case $MODE in
takeover) APP=kstate-failover-$(date +%s)-$$ ;;
restart) APP=kstate-recovery-$(date +%s)-$$ ;;
*) die "FAILOVER_MODE must be takeover or restart (got '$MODE')" ;;
esac
[[ $STANDBYS =~ ^[01]$ ]] || die "FAILOVER_STANDBYS must be 0 or 1 (got '$STANDBYS')"
[[ $STANDBYS == 0 || $MODE == takeover ]] || die "FAILOVER_STANDBYS=1 is for FAILOVER_MODE=takeover"
[[ $DETECTION_MS =~ ^[0-9]+$ ]] || die "FAILOVER_DETECTION_MS must be a number of milliseconds (got '$DETECTION_MS')"
[[ $DETECTION_MS == 0 || $STANDBYS == 1 ]] || die "FAILOVER_DETECTION_MS is for FAILOVER_STANDBYS=1"
read -r -a JAVA_OPTS <<<"${KS_JAVA_OPTS:-}"

[[ $ROWS =~ ^[1-9][0-9]*$ ]] || die "FAILOVER_ROWS must be a positive whole number (got '$ROWS')"
if [[ $MODE == restart ]] && ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
    die "FAILOVER_MODE=restart needs bash 5.1 or later (wait -n -p); this is $BASH_VERSION"
fi
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
# The client properties for every client of both systems (kstate's binaries and the jar read the
# same librdkafka file).
CLIENT=()
[[ -z ${CLIENT_PROPERTIES:-} ]] || CLIENT=(--client-properties "$CLIENT_PROPERTIES")
e2e() { KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP "$E2E_BIN" "$@" "${CLIENT[@]}"; }
log "broker $BOOTSTRAP${CLIENT_PROPERTIES:+ (client properties $CLIENT_PROPERTIES)}; $MODE; $ROWS keys of $KEY_BYTES bytes over $PARTITIONS partitions; logs in $LOG_DIR"

INPUT=$APP-in
e2e setup --input "$INPUT" --partitions "$PARTITIONS" --rows "$ROWS" --unique --key-bytes "$KEY_BYTES" \
    2>&1 | tee "$LOG_DIR/setup.log" >&2
touch_lease

# Stamps every line with the wall clock in ms, so that restore lines can be set against the kill.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s%3N)" "$line"; done; }

# start SYSTEM COPY [LOG]: starts one copy in the background (its output, stamped, in
# $LOG_DIR/LOG.log, default SYSTEM-COPY); its pid goes into PIDS and $LAST_PID. In restart mode
# the copy runs exactly-once, as a static group member named copy-COPY.
start() {
    local system=$1 copy=$2 app=$APP-$1 state=$LOG_DIR/state-$1-$2
    local out=$LOG_DIR/${3:-$1-$2}.log extra=()
    mkdir -p "$state"
    case $system in
    kafka-streams)
        if [[ $MODE == restart ]]; then
            extra=(--guarantee exactly-once --group-instance-id "copy-$copy")
        fi
        if ((STANDBYS > 0)); then
            extra+=(--standby-replicas "$STANDBYS")
        fi
        java "${JAVA_OPTS[@]}" -jar "$JAR" serve --bootstrap "$BOOTSTRAP" --application-id "$app" \
            --input "$INPUT" --output "$app-out" --state-dir "$state" \
            --session-timeout-ms "$SESSION_TIMEOUT_MS" --heartbeat-interval-ms "$HEARTBEAT_MS" \
            "${extra[@]}" "${CLIENT[@]}" > >(stamp >"$out") 2>&1 &
        ;;
    kstate)
        if [[ -n ${FAILOVER_RESTORE_THREADS:-} ]]; then
            extra+=(--restore-threads "$FAILOVER_RESTORE_THREADS")
        fi
        if [[ $MODE == restart ]]; then
            extra+=(--guarantee exactly-once --instance-id "copy-$copy" --threads 1
                --consumer-property "group.instance.id=copy-$copy")
        fi
        if ((STANDBYS > 0)); then
            extra+=(--instance-id "copy-$copy" --standby-replicas "$STANDBYS")
        fi
        if ((DETECTION_MS > 0)); then
            extra+=(--failure-detection-ms "$DETECTION_MS")
        fi
        KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP "$COUNT_BIN" --application-id "$app" --input "$INPUT" \
            --output "$app-out" --state-dir "$state" --commit-interval-ms 100 \
            --consumer-property "session.timeout.ms=$SESSION_TIMEOUT_MS" \
            --consumer-property "heartbeat.interval.ms=$HEARTBEAT_MS" \
            "${extra[@]}" "${CLIENT[@]}" > >(stamp >"$out") 2>&1 &
        ;;
    esac
    LAST_PID=$!
    PIDS+=("$LAST_PID")
}

# stop PID: SIGTERM, up to 120 s to exit, then SIGKILL.
stop() {
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 120); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
    kill -KILL "$1" 2>/dev/null || true
}

# detail SYSTEM FAILOVER_LOG STATE_BYTES COPY_LOG [restart]: prints the failover-detail line from
# the restore lines COPY_LOG has after the kill (with "restart", also until_running_s: from the
# kill to the restarted copy's "running" line), sets SECONDS_<system>.
detail() {
    local system=$1 failover_log=$2 state_bytes=$3 copy_log=$4 restart=${5:-}
    local summary seconds killed_at
    summary=$(grep '^failover seconds=' "$failover_log" | tail -n 1)
    [[ -n $summary ]] || die "$system: no failover line (see $failover_log)"
    seconds=$(sed 's/^failover seconds=\([0-9.]*\) .*/\1/' <<<"$summary")
    killed_at=$(sed 's/.* killed_at_ms=\([0-9]*\).*/\1/' <<<"$summary")
    # The restore lines after the kill: kstate "count_by_key: restore(d) T/P ...", Kafka Streams
    # "kafka-streams serve: restore(d) T/P ...".
    awk -v since="$killed_at" -v sys="$system" -v seconds="$seconds" -v bytes="$state_bytes" \
        -v restart="$restart" '
        $1 >= since && / running/ { if (!running) running = $1 }
        $1 >= since && / restore [^ ]+\/[0-9]+ from / { if (!first) first = $1 }
        $1 >= since && / restored [^ ]+\/[0-9]+ / {
            last = $1
            if (match($0, /\(([0-9]+) records\)/)) { n += substr($0, RSTART + 1, RLENGTH - 10) }
        }
        END {
            until_first = first ? (first - since) / 1000 : -1
            restore = (first && last) ? (last - first) / 1000 : -1
            printf "failover-detail system=%s seconds=%s until_first_restore_s=%.3f restore_s=%.3f restored=%d state_bytes=%s", sys, seconds, until_first, restore, n, bytes
            if (restart) printf " until_running_s=%.3f", running ? (running - since) / 1000 : -1
            printf "\n"
        }' "$copy_log" | tee -a "$LOG_DIR/details"
    printf -v "SECONDS_${system//-/_}" '%s' "$seconds"
}

# run SYSTEM: one takeover failover of SYSTEM; prints its failover-detail line, sets
# SECONDS_<system>.
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
    stop "$b"
    touch_lease
    detail "$system" "$LOG_DIR/$system-failover.log" "$state_bytes" "$LOG_DIR/$system-b.log"
    rm -rf "$LOG_DIR/state-$system-a" "$LOG_DIR/state-$system-b"
}

# run_restart SYSTEM: one exactly-once SIGKILL and restart of SYSTEM's one copy; prints its
# failover-detail line (from the restarted copy's log, SYSTEM-a-restart.log), sets
# SECONDS_<system>.
run_restart() {
    local system=$1 app=$APP-$1
    e2e output --topic "$app-out" --partitions "$PARTITIONS"
    log "$system: one copy processing $ROWS records exactly-once"
    start "$system" a
    local a=$LAST_PID
    # Under exactly-once the output's watermarks also count commit markers: wait for the
    # group's committed input offsets too.
    e2e wait --output "$app-out" --records "$ROWS" --group "$app" --input "$INPUT" --timeout-s 3600
    touch_lease
    sleep 5 # as in takeover mode
    kill -0 "$a" 2>/dev/null || die "$system: the copy exited before the kill (see $LOG_DIR/$system-a.log)"
    local state_bytes
    state_bytes=$(du -sb "$LOG_DIR/state-$system-a" | cut -f1)
    log "$system: the copy holds $state_bytes bytes of state; SIGKILL it and restart it"
    e2e failover --input "$INPUT" --output "$app-out" --kill "$a" --timeout-s 900 \
        --json "$LOG_DIR/$system-failover.json" >"$LOG_DIR/$system-failover.log" &
    local failover=$! ended
    # Whichever ends first: the copy (the kill landed: restart it now, while the markers are
    # written) or e2e failover (it failed before killing).
    wait -n -p ended "$a" "$failover" 2>/dev/null || true # (no "Killed" job notice)
    [[ ${ended:-} == "$a" ]] || {
        cat "$LOG_DIR/$system-failover.log" >&2
        die "$system: e2e failover ended before the copy died"
    }
    start "$system" a "$system-a-restart"
    local restarted=$LAST_PID
    local rc=0
    wait "$failover" || rc=$?
    cat "$LOG_DIR/$system-failover.log" >&2
    ((rc == 0)) || die "$system: e2e failover failed (exit $rc; the restarted copy's log: $LOG_DIR/$system-a-restart.log)"
    stop "$restarted"
    touch_lease
    detail "$system" "$LOG_DIR/$system-failover.log" "$state_bytes" "$LOG_DIR/$system-a-restart.log" restart
    rm -rf "$LOG_DIR/state-$system-a"
}

SYSTEMS=${FAILOVER_SYSTEMS:-kafka-streams kstate}
for system in $SYSTEMS; do
    if [[ $MODE == restart ]]; then run_restart "$system"; else run "$system"; fi
done
[[ $SYSTEMS == *kafka-streams* && $SYSTEMS == *kstate* ]] || exit 0

if [[ ${KEEP_TOPICS:-0} == 0 ]]; then
    # Through e2e, with the same client properties as every other client.
    topics=$INPUT,$APP-kafka-streams-out,$APP-kstate-out
    topics+=,$APP-kafka-streams-counts-changelog,$APP-kstate-counts-changelog
    ((DETECTION_MS == 0)) || topics+=,$APP-kstate-liveness
    e2e delete-topics --topics "$topics" >/dev/null 2>&1 || log "could not delete $topics"
fi

RESULT=failover
((STANDBYS == 0)) || RESULT=failover-standby
[[ $MODE == takeover ]] || RESULT=recovery-eos
DETECTION_FIELD=
((DETECTION_MS == 0)) || DETECTION_FIELD=" kstate_failure_detection_ms=$DETECTION_MS"
echo "$RESULT kafka-streams=${SECONDS_kafka_streams}s kstate=${SECONDS_kstate}s" \
    "ratio=$(awk -v a="$SECONDS_kafka_streams" -v b="$SECONDS_kstate" 'BEGIN { printf "%.2f", a / b }')$DETECTION_FIELD"
