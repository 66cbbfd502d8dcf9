#!/usr/bin/env bash
# benches/kafka-streams/compare.sh [ROWS]: kstate against Kafka Streams on one broker.
#
#   1. kstate's rows_per_second example (logged-group) puts ROWS rows into its logged store,
#      whose changelog is APP-store-changelog, then restores that changelog into an empty dir;
#   2. a Kafka Streams app (this folder's jar, `restore` mode) restores the very same topic into
#      its own persistent (RocksDB) store;
#   3. the same app in `puts` mode puts ROWS records into a logged store through a topology;
#   4. end to end, on a fresh E2E_PARTITIONS-partition input of E2E_ROWS keyed records (10,000
#      keys): `groupByKey().count()` to an output topic in Kafka Streams (caching off, then on)
#      and kstate's count-by-key task (`e2e kstate`, kstate-bench's e2e binary, coalescing off,
#      then on), and a bare rdkafka pipe doing the same broker work with no state (consume one,
#      produce two);
#      then both count-by-keys again exactly-once, caching off (Kafka Streams:
#      processing.guarantee=exactly_once_v2, commit.interval.ms=100; kstate: `--guarantee
#      exactly-once`, one transaction per worker and commit interval); each measured by
#      `e2e measure` from its output topic's broker append times (read_committed);
#   5. the failover (failover.sh, whose header says how): two copies of each system's count-by-key
#      application, one SIGKILLed with about 1 GB of state; seconds until the survivor has
#      processed a record of every partition that moved to it;
#   6. the recovery under exactly-once (failover.sh with FAILOVER_MODE=restart): one copy of each
#      system's count-by-key application, exactly-once, static group membership, SIGKILLed with
#      all the state (about 2 GB) and restarted at once on the same state dir; seconds until it
#      has processed a record of every partition again (Kafka Streams under exactly_once_v2
#      wipes and restores its stores in full, kstate replays the changelog's tail);
#   7. latency (LATENCY_*): an empty LogAppendTime input, each system's count-by-key started on it
#      (caching off; at-least-once, then exactly-once), then `e2e paced` writes LATENCY_WARMUP
#      records at once, waits for their outputs, and writes the rest of LATENCY_ROWS at
#      LATENCY_RATE records/s while reading the output (read_committed); per paced record the
#      time from the input's append to the output's append and to when the reader had it;
#   8. windowed (ONLY=windowed): on a fresh E2E_PARTITIONS-partition input of E2E_ROWS keyed
#      records (10,000 keys) whose timestamps advance WINDOWED_STEP_MS per record (`e2e setup
#      --event-time-step-ms`; 1.2: a minute of event time every 50,000 records, about 5 records
#      per key and window; each partition's first record 2 minutes earlier and its last 2 minutes
#      later, `--event-time-bookends-ms`, so that final counts go out from the start of a run to
#      its end), counts per key in tumbling 1-minute windows with a 10 s grace, output
#      `<key>@<window start ms>` -> count: Kafka Streams'
#      `groupByKey().windowedBy(TimeWindows.ofSizeAndGrace(1 min, 10 s)).count()` (the jar's `e2e
#      --topology windowed`, a RocksDB window store, caching off) and kstate's window store
#      (`e2e kstate --topology windowed`), each at-least-once, then exactly-once, emitting every
#      window's new count (one output per input, measured like 4., and each window's highest
#      count checked against the input: `e2e measure --expect window-updates`), then
#      at-least-once emitting only final counts (Kafka Streams `emitStrategy(onWindowClose())`
#      with its store's retention raised to 10 minutes, without which it lost windows: see the
#      README; kstate kstate_bench::topology::windowed_count), measured by `e2e measure --expect
#      windows`: the same
#      clock and rate, and every output checked against the input (the log gives each system's
#      windows sent of those that closed: Kafka Streams sends closed windows at most once a
#      second per task, so it may stop before it sent the last ones, and with E2E_ROWS too small,
#      100000, it sent none and the measure fails; 300000 and more worked);
#   9. the last lines compare the rates:
#        restore kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#        puts kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#        e2e-alos kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#        e2e-alos-cached kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#        e2e-pipe rdkafka=<r>/s kstate=<r>/s ratio=<kstate/rdkafka>
#        e2e-eos kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#        e2e-eos-overhead kstate-alos=<r>/s kstate-eos=<r>/s eos/alos=<kstate-eos/kstate-alos>
#        windowed-alos kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#        windowed-eos kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#        windowed-final kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#        failover kafka-streams=<s>s kstate=<s>s ratio=<kafka-streams/kstate>
#        recovery-eos kafka-streams=<s>s kstate=<s>s ratio=<kafka-streams/kstate>
#        resources-alos kafka-streams=<cpu>s/<rss>MB kstate=<cpu>s/<rss>MB
#        resources-eos  kafka-streams=... kstate=...
#        latency-alos kafka-streams=<p50>/<p95>/<p99>/<p99.9>ms kstate=... (visible)
#        latency-eos  kafka-streams=... kstate=...
#        broker-kill-alos kafka-streams=<next>/<every>/<max>ms kstate=<next>/<every>/<max>ms
#        broker-kill-eos  kafka-streams=... kstate=...
#      (resources: CPU seconds, user and system, per million records of E2E_ROWS, and peak RSS,
#      of each system's caching-off end-to-end process, from /usr/bin/time: start and group
#      join included);
#  10. the broker kill (ONLY=broker-kill, on the three-node cluster of `scripts/kafka start
#      --nodes 3`, whose bootstrap list KAFKA_BOOTSTRAP_SERVERS or CLIENT_PROPERTIES names):
#      like the latency runs (7.), each system at-least-once, then exactly-once, but
#      BROKER_KILL_AFTER_S seconds into the pacing the leader of the input's partition 0 is
#      SIGKILLed (`scripts/kafka kill N`), and restarted and back in every ISR (`e2e in-sync`)
#      after the run; from the kill until the reader had the output of an input appended after
#      it, first on any partition (<next>: the application's next committed output), then on
#      every partition (<every>: the partition whose leader died waits for KRaft to fence its
#      broker, broker.session.timeout.ms, 9 s), and the slowest visible latency of an input
#      appended from 10 s before the kill on (<max>);
#      (e2e-eos-overhead: kstate's exactly-once rate against its at-least-once, caching off, rate
#      of the same run, i.e. e2e-alos's kstate number; windowed-alos and windowed-eos: emitting
#      every update, caching off; windowed-final: final counts only, at-least-once).
#
# ROWS: the first argument, else $ROWS, else 1000000.
# Environment:
#   CLIENT_PROPERTIES        a librdkafka properties file (key=value lines: bootstrap.servers,
#                            security.protocol, sasl.mechanisms, sasl.username, sasl.password,
#                            ssl.ca.location, ...), e.g. the sasl_ssl.properties that
#                            `scripts/kafka start --secure` prints: its bootstrap.servers is the
#                            broker, and it goes to every client of both systems (e2e
#                            --client-properties, the jar's --client-properties, which translates
#                            it to the Java clients' names; rows_per_second, count_by_key and
#                            failover.sh take it too): every part runs over it. The password is
#                            never printed, and the file is not copied.
#   KAFKA_BOOTSTRAP_SERVERS  use this broker when CLIENT_PROPERTIES is not given; otherwise
#                            scripts/kafka start (stopped at the end only if this script
#                            started it)
#   KSTATE_ROWS_PER_SECOND   kstate's rows_per_second example binary (default
#                            $HOME/.cache/kstate-target/release/examples/rows_per_second)
#   KS_JAVA_OPTS             extra JVM options for the Kafka Streams runs (space-separated)
#   E2E_ROWS                 records of the end-to-end runs (default: ROWS)
#   E2E_PARTITIONS           the end-to-end input's partitions (default 4)
#   ONLY=base                only the puts and restores (1.-3.)
#   ONLY=e2e | ONLY=failover run only the end-to-end part (4.) or only the failover (5.);
#   ONLY=recovery            only the exactly-once recovery (6.): prints recovery-eos only
#   ONLY=eos                 only the exactly-once end-to-end pair and kstate's at-least-once
#                            run (caching off) for the overhead line: prints e2e-eos and
#                            e2e-eos-overhead only
#   ONLY=latency             only the latency runs (7.)
#   ONLY=failover-standby    only the failover with a standby replica on both systems
#                            (failover.sh FAILOVER_STANDBYS=1; not part of ONLY=all): prints
#                            failover-standby only; FAILOVER_DETECTION_MS=1000 in the
#                            environment gives kstate's copies failure detection
#   ONLY=windowed            only the windowed runs (8.): prints windowed-alos, windowed-eos and
#                            windowed-final only
#   ONLY=broker-kill         only the broker kill (10.; not part of ONLY=all: it needs the
#                            three-node cluster)
#                            (default ONLY=all: everything; parts can be combined with commas,
#                            e.g. ONLY=e2e,latency)
#   LATENCY_ROWS             records per latency run, warm-up included (default 250000)
#   LATENCY_RATE             the paced records' rate, records/s (default 10000)
#   LATENCY_WARMUP           warm-up records (default 50000: enough for the JVM's JIT too)
#   WINDOWED_STEP_MS         the windowed input's event time per record, ms (default 1.2)
#   BROKER_KILL_ROWS         records per broker-kill run, warm-up included (default 450000:
#                            40 s of pacing at the default rate, 30 s of them after the kill)
#   BROKER_KILL_AFTER_S      seconds of pacing before the kill (default 10)
#   FAILOVER_*, SESSION_TIMEOUT_MS, HEARTBEAT_MS
#                            the failover's and the recovery's settings (see failover.sh;
#                            FAILOVER_MODE is set by this script: takeover for 5., restart
#                            for 6.)
#   KSTATE_E2E               kstate's e2e benchmark binary (kstate-bench; default
#                            $HOME/.cache/kstate-target/release/e2e: in the release directory
#                            above rows_per_second's examples/)
#   KSTATE_COUNT_BY_KEY      kstate-bench's count_by_key binary, for the failover and the
#                            recovery (default next to e2e)
#   KEEP_TOPICS=1            keep the topics (and consumer groups) instead of deleting them
#   LOG_DIR                  where the raw outputs go (default: a new temp dir, kept)
set -euo pipefail

SCRIPT_NAME=compare.sh
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROWS=${1:-${ROWS:-1000000}}
ROWS=${ROWS//_/}
KSTATE_BIN=${KSTATE_ROWS_PER_SECOND:-$HOME/.cache/kstate-target/release/examples/rows_per_second}
E2E_BIN=${KSTATE_E2E:-$(dirname "$(dirname "$KSTATE_BIN")")/e2e}
# failover.sh's kstate copies: kstate-bench's count_by_key, beside e2e.
COUNT_BIN=${KSTATE_COUNT_BY_KEY:-$(dirname "$E2E_BIN")/count_by_key}
E2E_ROWS=${E2E_ROWS:-$ROWS}
E2E_PARTITIONS=${E2E_PARTITIONS:-4}
ONLY=${ONLY:-all}
LATENCY_ROWS=${LATENCY_ROWS:-250000}
LATENCY_RATE=${LATENCY_RATE:-10000}
LATENCY_WARMUP=${LATENCY_WARMUP:-50000}
WINDOWED_STEP_MS=${WINDOWED_STEP_MS:-1.2}
BROKER_KILL_ROWS=${BROKER_KILL_ROWS:-450000}
BROKER_KILL_AFTER_S=${BROKER_KILL_AFTER_S:-10}
STORE=store
APP=kstate-vs-ks-$(date +%s)-$$
CHANGELOG=$APP-$STORE-changelog
read -r -a JAVA_OPTS <<<"${KS_JAVA_OPTS:-}"
DELETE_TOPICS=(--delete-topics)
[[ ${KEEP_TOPICS:-0} == 0 ]] || DELETE_TOPICS=()

[[ $ROWS =~ ^[1-9][0-9]*$ ]] || die "ROWS must be a positive whole number (got '$ROWS')"

# The parts ONLY asks for (comma-separated): base (a.-c.), e2e, eos, failover, recovery, latency,
# windowed.
want_base=0 want_e2e=0 want_eos=0 want_failover=0 want_recovery=0 want_latency=0 want_windowed=0
want_failover_standby=0 want_broker_kill=0
IFS=, read -r -a only_parts <<<"$ONLY"
for part in "${only_parts[@]}"; do
    case $part in
        all) want_base=1 want_e2e=1 want_failover=1 want_recovery=1 want_latency=1 want_windowed=1 ;;
        base) want_base=1 ;;
        e2e) want_e2e=1 ;;
        eos) want_eos=1 ;;
        failover) want_failover=1 ;;
        failover-standby) want_failover_standby=1 ;;
        recovery) want_recovery=1 ;;
        latency) want_latency=1 ;;
        windowed) want_windowed=1 ;;
        broker-kill) want_broker_kill=1 ;;
        *) die "ONLY=$ONLY: all, base, e2e, eos, failover, failover-standby, recovery, latency, windowed or broker-kill (or several, comma-separated)" ;;
    esac
done
# The e2e part includes the exactly-once pair.
[[ $want_e2e == 0 ]] || want_eos=1
# The client properties for every client of both systems.
E2E_CLIENT=()
KS_CLIENT=()
if [[ -n ${CLIENT_PROPERTIES:-} ]]; then
    E2E_CLIENT=(--client-properties "$CLIENT_PROPERTIES")
    KS_CLIENT=(--client-properties "$CLIENT_PROPERTIES")
fi

# rows_per_second runs in the base part only; every other part needs only e2e.
if [[ ($want_base == 1 && ! -x $KSTATE_BIN) || ! -x $E2E_BIN ]]; then
    cat >&2 <<EOF
compare.sh: kstate's binaries are missing: $KSTATE_BIN, $E2E_BIN
Build them with:
  cd $ROOT && CARGO_TARGET_DIR=\$HOME/.cache/kstate-target cargo build --release --workspace --all-targets
(or set KSTATE_ROWS_PER_SECOND and KSTATE_E2E to built rows_per_second and e2e binaries)
EOF
    exit 1
fi

LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/kstate-vs-kafka-streams.XXXXXX")}
mkdir -p "$LOG_DIR"

# ------------------------------------------------------------------ the Java side, the broker

ensure_jar "$LOG_DIR/mvn.log"
# The node a broker-kill run SIGKILLed, restarted (and the cluster back in sync) after the run,
# or on the way out of a run that failed.
KILLED_NODE=
restart_killed_node() {
    [[ -n $KILLED_NODE ]] || return 0
    log "restarting node $KILLED_NODE"
    "$KAFKA_SCRIPT" restart "$KILLED_NODE" >&2 || log "warning: scripts/kafka restart $KILLED_NODE failed"
    KILLED_NODE=
    e2e in-sync --timeout-s 300
}
trap 'restart_killed_node; stop_started_broker' EXIT
broker_up
log "broker $BOOTSTRAP${CLIENT_PROPERTIES:+ (client properties $CLIENT_PROPERTIES)}; rows $ROWS; app $APP; raw outputs in $LOG_DIR"

# field FILE SED_EXPRESSION WHAT: the one value the expression captures, or die.
field() {
    local v
    v=$(sed -n "$2" "$1" | tail -n 1)
    [[ -n $v ]] || die "no $3 in $1"
    printf '%s\n' "$v"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
rate() { awk -v n="$1" -v ms="$2" 'BEGIN { printf "%.0f", n / (ms / 1000) }'; }

# timed COMMAND...: COMMAND, under /usr/bin/time when RUN_TIME_FILE names where its CPU
# seconds and peak RSS go (e2e_run sets it for the application it runs).
timed() {
    if [[ -n ${RUN_TIME_FILE:-} ]]; then
        /usr/bin/time -o "$RUN_TIME_FILE" -f 'cpu_user_s=%U cpu_system_s=%S max_rss_kb=%M' "$@"
    else
        "$@"
    fi
}
# Every e2e command, with the client properties.
e2e() { KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP timed "$E2E_BIN" "$@" "${E2E_CLIENT[@]}"; }
# Deletes topics through the e2e binary (the same client properties as everything else).
delete_topics() {
    local IFS=,
    e2e delete-topics --topics "$*" >/dev/null 2>&1 || log "could not delete topics $*"
}

if [[ $want_base == 1 ]]; then
# ------------------------------------------------------------------ a. kstate

log "a. kstate: rows_per_second --configs logged-group --rows $ROWS --restore-topic $CHANGELOG"
KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP "$KSTATE_BIN" --configs logged-group --rows "$ROWS" \
    --restore-topic "$CHANGELOG" "${E2E_CLIENT[@]}" 2>&1 | tee "$LOG_DIR/kstate.log"
summary='^summary config=logged-group threads=1 rows=[0-9]* ms=\([0-9]*\) rows_per_sec=\([0-9]*\)$'
restored='^restored \([0-9]*\) records in \([0-9]*\) ms (\([0-9]*\) records/s)$'
kstate_puts=$(field "$LOG_DIR/kstate.log" "s#$summary#\\2#p" "kstate puts summary")
kstate_puts_ms=$(field "$LOG_DIR/kstate.log" "s#$summary#\\1#p" "kstate puts summary")
kstate_flush_ms=$(field "$LOG_DIR/kstate.log" \
    's/^latency config=logged-group .* flush_ms=\([0-9]*\)$/\1/p' "kstate flush_ms")
kstate_restore=$(field "$LOG_DIR/kstate.log" "s#$restored#\\3#p" "kstate restore line")
kstate_restored=$(field "$LOG_DIR/kstate.log" "s#$restored#\\1#p" "kstate restore line")
touch_lease

# ------------------------------------------------------------------ b. Kafka Streams restore

log "b. kafka-streams: restore $CHANGELOG"
java "${JAVA_OPTS[@]}" -jar "$JAR" restore --bootstrap "$BOOTSTRAP" --application-id "$APP" \
    --store "$STORE" "${DELETE_TOPICS[@]}" "${KS_CLIENT[@]}" 2>&1 | tee "$LOG_DIR/kafka-streams-restore.log"
ks_restored_re='^kafka-streams restored \([0-9]*\) records in \([0-9]*\) ms (\([0-9]*\) records/s)$'
ks_restore=$(field "$LOG_DIR/kafka-streams-restore.log" "s#$ks_restored_re#\\3#p" \
    "kafka-streams restore line")
ks_restored=$(field "$LOG_DIR/kafka-streams-restore.log" "s#$ks_restored_re#\\1#p" \
    "kafka-streams restore line")
if [[ $ks_restored != "$kstate_restored" ]]; then
    log "warning: kstate restored $kstate_restored records, kafka-streams $ks_restored"
fi
touch_lease

# ------------------------------------------------------------------ c. Kafka Streams puts

log "c. kafka-streams: puts --rows $ROWS"
java "${JAVA_OPTS[@]}" -jar "$JAR" puts --bootstrap "$BOOTSTRAP" --rows "$ROWS" \
    --application-id "$APP-puts" --store "$STORE" "${DELETE_TOPICS[@]}" "${KS_CLIENT[@]}" 2>&1 |
    tee "$LOG_DIR/kafka-streams-puts.log"
ks_puts=$(field "$LOG_DIR/kafka-streams-puts.log" \
    's/^kafka-streams puts rows=[0-9]* ms=[0-9]* rows_per_sec=\([0-9]*\)$/\1/p' \
    "kafka-streams puts line")
ks_acked=$(sed -n 's/^kafka-streams puts changelog-acked rows=[0-9]* ms=[0-9]* rows_per_sec=\([0-9]*\) .*/\1/p' \
    "$LOG_DIR/kafka-streams-puts.log" | tail -n 1)
touch_lease

fi

# ------------------------------------------------------------------ the end-to-end runs' tools

e2e_rate() {
    field "$1" 's/^e2e output=.* records_per_sec=\([0-9]*\)$/\1/p' "e2e measure line"
}
# e2e_resources NAME: the run's CPU seconds (user + system) per million records and its peak
# RSS, "<cpu>s/<rss>MB", from $LOG_DIR/NAME.time (the whole process: start, group join and
# every record of E2E_ROWS).
e2e_resources() {
    local line
    line=$(grep '^cpu_user_s=' "$LOG_DIR/$1.time" | tail -n 1)
    [[ -n $line ]] || die "no CPU and RSS line in $LOG_DIR/$1.time"
    awk -v line="$line" -v rows="$E2E_ROWS" 'BEGIN {
        split(line, f, /[ =]/)
        printf "%.1fs/%.0fMB", (f[2] + f[4]) / (rows / 1e6), f[6] / 1024
    }'
}
# resources_line LABEL KS_NAME KSTATE_NAME: both runs' CPU per million records and peak RSS.
resources_line() {
    echo "$1 kafka-streams=$(e2e_resources "$2") kstate=$(e2e_resources "$3") (CPU s per million records/peak RSS)"
}
# e2e_run NAME EXPECT COMMAND...: a fresh LogAppendTime output topic $APP-NAME-out, the command
# (reading $E2E_IN), the measure (--expect EXPECT; windows and window-updates: checked against
# $E2E_IN); leaves the rate in $LOG_DIR/NAME.measure and NAME in e2e_ran. NAME is also the
# application id's suffix.
e2e_ran=()
e2e_run() {
    local name=$1 expect=$2
    shift 2
    local out=$APP-$name-out
    local against=()
    [[ $expect != window* ]] || against=(--input "$E2E_IN")
    e2e_ran+=("$name")
    e2e output --topic "$out" --partitions "$E2E_PARTITIONS"
    log "$name"
    RUN_TIME_FILE=$LOG_DIR/$name.time "$@" --output "$out" 2>&1 | tee "$LOG_DIR/$name.log"
    e2e measure --output "$out" --partitions "$E2E_PARTITIONS" --rows "$E2E_ROWS" \
        --expect "$expect" "${against[@]}" | tee "$LOG_DIR/$name.measure"
    touch_lease
}
ks_e2e() {
    timed java "${JAVA_OPTS[@]}" -jar "$JAR" e2e --bootstrap "$BOOTSTRAP" --input "$E2E_IN" \
        --rows "$E2E_ROWS" "${KS_CLIENT[@]}" "$@"
}
kstate_e2e() {
    local name=$1
    shift
    e2e kstate --input "$E2E_IN" --rows "$E2E_ROWS" --application-id "$APP-$name" "$@"
}
# Deletes the input, and the runs' outputs and changelogs (unless KEEP_TOPICS), extra topics
# first; empties e2e_ran.
delete_e2e_topics() {
    if [[ ${KEEP_TOPICS:-0} == 0 ]]; then
        local topics=("$E2E_IN" "$@") name
        for name in "${e2e_ran[@]}"; do
            topics+=("$APP-$name-out" "$APP-$name-counts-changelog")
        done
        delete_topics "${topics[@]}"
    fi
    e2e_ran=()
}

if [[ $want_eos == 1 ]]; then
# ------------------------------------------------------------------ d. end to end

E2E_IN=$APP-e2e-in
log "d. end to end: $E2E_ROWS records into $E2E_IN ($E2E_PARTITIONS partitions)"
e2e setup --input "$E2E_IN" --partitions "$E2E_PARTITIONS" --rows "$E2E_ROWS" 2>&1 |
    tee "$LOG_DIR/e2e-setup.log"
if [[ $want_e2e == 1 ]]; then
    e2e_run ks-uncached records ks_e2e --application-id "$APP-ks-uncached" --caching off
fi
e2e_run kstate-uncached records kstate_e2e kstate-uncached
if [[ $want_e2e == 1 ]]; then
    e2e_run ks-cached counts ks_e2e --application-id "$APP-ks-cached" --caching on
    e2e_run kstate-cached counts kstate_e2e kstate-cached --coalesce
    e2e_run pipe records e2e pipe --input "$E2E_IN" --rows "$E2E_ROWS" --application-id "$APP-pipe"
    e2e_ks=$(e2e_rate "$LOG_DIR/ks-uncached.measure")
    e2e_ks_cached=$(e2e_rate "$LOG_DIR/ks-cached.measure")
    e2e_kstate_cached=$(e2e_rate "$LOG_DIR/kstate-cached.measure")
    e2e_pipe=$(e2e_rate "$LOG_DIR/pipe.measure")
fi
# Exactly-once, caching off: the same topology and commit interval as ks-uncached and
# kstate-uncached.
e2e_run ks-eos records ks_e2e --application-id "$APP-ks-eos" --caching off --guarantee exactly-once
e2e_run kstate-eos records kstate_e2e kstate-eos --guarantee exactly-once
e2e_kstate=$(e2e_rate "$LOG_DIR/kstate-uncached.measure")
e2e_ks_eos=$(e2e_rate "$LOG_DIR/ks-eos.measure")
e2e_kstate_eos=$(e2e_rate "$LOG_DIR/kstate-eos.measure")
delete_e2e_topics "$APP-pipe-shadow-changelog"

fi

if [[ $want_windowed == 1 ]]; then
# ------------------------------------------------------------------ windowed

E2E_IN=$APP-win-in
log "windowed: $E2E_ROWS records into $E2E_IN ($E2E_PARTITIONS partitions), event time +$WINDOWED_STEP_MS ms per record"
e2e setup --input "$E2E_IN" --partitions "$E2E_PARTITIONS" --rows "$E2E_ROWS" \
    --event-time-step-ms "$WINDOWED_STEP_MS" --event-time-bookends-ms 120000 2>&1 |
    tee "$LOG_DIR/win-setup.log"
WINDOWED=(--topology windowed)
e2e_run ks-win-alos window-updates ks_e2e --application-id "$APP-ks-win-alos" "${WINDOWED[@]}" --caching off
e2e_run kstate-win-alos window-updates kstate_e2e kstate-win-alos "${WINDOWED[@]}"
e2e_run ks-win-eos window-updates ks_e2e --application-id "$APP-ks-win-eos" "${WINDOWED[@]}" --caching off \
    --guarantee exactly-once
e2e_run kstate-win-eos window-updates kstate_e2e kstate-win-eos "${WINDOWED[@]}" --guarantee exactly-once
e2e_run ks-win-final windows ks_e2e --application-id "$APP-ks-win-final" "${WINDOWED[@]}" --emit final \
    --caching off
e2e_run kstate-win-final windows kstate_e2e kstate-win-final "${WINDOWED[@]}" --emit final
windowed_alos="kafka-streams=$(e2e_rate "$LOG_DIR/ks-win-alos.measure")/s kstate=$(e2e_rate "$LOG_DIR/kstate-win-alos.measure")/s"
windowed_eos="kafka-streams=$(e2e_rate "$LOG_DIR/ks-win-eos.measure")/s kstate=$(e2e_rate "$LOG_DIR/kstate-win-eos.measure")/s"
windowed_final="kafka-streams=$(e2e_rate "$LOG_DIR/ks-win-final.measure")/s kstate=$(e2e_rate "$LOG_DIR/kstate-win-final.measure")/s"
windowed_ratio() { ratio "$(e2e_rate "$LOG_DIR/kstate-$1.measure")" "$(e2e_rate "$LOG_DIR/ks-$1.measure")"; }
# Windows each final run sent, of those that closed (a run may stop before its last ones).
windows_sent() { field "$1" 's/^e2e output=.* windows=\([0-9]*\/[0-9]*\) .*/\1/p' "windows= in the measure line"; }
log "windowed-final windows sent/closed: kafka-streams $(windows_sent "$LOG_DIR/ks-win-final.measure")," \
    "kstate $(windows_sent "$LOG_DIR/kstate-win-final.measure")"
delete_e2e_topics

fi

# ------------------------------------------------------------------ latency

# latency_run NAME ROWS COMMAND... [-- PACED FLAGS...]: a fresh LogAppendTime input
# $APP-NAME-in and output $APP-NAME-out; COMMAND (given --input, --output, --rows ROWS) in the
# background, `e2e paced` (ROWS, LATENCY_WARMUP of them at once, then LATENCY_RATE/s, and the
# PACED FLAGS) in the foreground (its lines in $LOG_DIR/NAME.latency), then waits for COMMAND
# to finish. The topics go on latency_topics.
latency_topics=()
declare -A latency_made=()
# latency_topics_of NAME: creates latency_run NAME's input and output (once).
latency_topics_of() {
    local name=$1
    [[ -z ${latency_made[$name]:-} ]] || return 0
    latency_made[$name]=1
    latency_topics+=("$APP-$name-in" "$APP-$name-out" "$APP-$name-counts-changelog")
    e2e output --topic "$APP-$name-in" --partitions "$E2E_PARTITIONS"
    e2e output --topic "$APP-$name-out" --partitions "$E2E_PARTITIONS"
}
latency_run() {
    local name=$1 rows=$2
    shift 2
    local command=() paced=()
    while (($#)) && [[ $1 != -- ]]; do command+=("$1"); shift; done
    (($# == 0)) || { shift; paced=("$@"); }
    local in=$APP-$name-in out=$APP-$name-out pid
    latency_topics_of "$name"
    log "latency: $name ($rows records, $LATENCY_WARMUP of them warm-up, then $LATENCY_RATE/s) ${paced[*]}"
    "${command[@]}" --input "$in" --output "$out" --rows "$rows" >"$LOG_DIR/$name.log" 2>&1 &
    pid=$!
    if ! e2e paced --input "$in" --output "$out" --rows "$rows" --rate "$LATENCY_RATE" \
        --warmup "$LATENCY_WARMUP" --json "$LOG_DIR/$name.latency.json" "${paced[@]}" | tee "$LOG_DIR/$name.latency"; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        tail -n 20 "$LOG_DIR/$name.log" >&2
        die "latency run $name failed (log: $LOG_DIR/$name.log)"
    fi
    wait "$pid" || die "$name failed after its latency run (log: $LOG_DIR/$name.log)"
    touch_lease
}
# Run in the background only: `exec` makes $! the application's own pid, so that a failed
# run can stop it.
exec_ks_app() { exec java "${JAVA_OPTS[@]}" -jar "$JAR" e2e --bootstrap "$BOOTSTRAP" "${KS_CLIENT[@]}" "$@"; }
exec_kstate_app() { KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP exec "$E2E_BIN" kstate "$@" "${E2E_CLIENT[@]}"; }

latency_alos=
latency_eos=
if [[ $want_latency == 1 ]]; then
    latency_run ks-lat-alos "$LATENCY_ROWS" exec_ks_app --application-id "$APP-ks-lat-alos" --caching off
    latency_run kstate-lat-alos "$LATENCY_ROWS" exec_kstate_app --application-id "$APP-kstate-lat-alos"
    latency_run ks-lat-eos "$LATENCY_ROWS" exec_ks_app --application-id "$APP-ks-lat-eos" --caching off --guarantee exactly-once
    latency_run kstate-lat-eos "$LATENCY_ROWS" exec_kstate_app --application-id "$APP-kstate-lat-eos" --guarantee exactly-once
    # p50/p99/p99.9 of the visible latency (input append until the reader had the output).
    visible() {
        field "$1" 's/^e2e latency .* visible_p50_ms=\([0-9]*\) visible_p95_ms=\([0-9]*\) visible_p99_ms=\([0-9]*\) visible_p999_ms=\([0-9]*\) .*/\1\/\2\/\3\/\4/p' \
            "e2e latency line"
    }
    latency_alos="kafka-streams=$(visible "$LOG_DIR/ks-lat-alos.latency")ms kstate=$(visible "$LOG_DIR/kstate-lat-alos.latency")ms"
    latency_eos="kafka-streams=$(visible "$LOG_DIR/ks-lat-eos.latency")ms kstate=$(visible "$LOG_DIR/kstate-lat-eos.latency")ms"
    [[ ${KEEP_TOPICS:-0} != 0 ]] || delete_topics "${latency_topics[@]}"
    latency_topics=()
fi

# ------------------------------------------------------------------ the broker kill

broker_kill_alos=
broker_kill_eos=
if [[ $want_broker_kill == 1 ]]; then
    "$KAFKA_SCRIPT" status --nodes 3 >/dev/null 2>&1 ||
        die "ONLY=broker-kill needs the three-node cluster: scripts/kafka start --nodes 3, and its bootstrap list in KAFKA_BOOTSTRAP_SERVERS"
    # broker_kill_run NAME COMMAND...: a latency run whose pacing SIGKILLs the leader of the
    # input's partition 0 after BROKER_KILL_AFTER_S s; the node is restarted and the cluster back
    # in sync afterwards, whatever happened.
    broker_kill_run() {
        local name=$1
        shift
        e2e in-sync --timeout-s 300
        latency_topics_of "$name"
        KILLED_NODE=$(e2e leader --topic "$APP-$name-in" --partition 0)
        log "broker kill: $name, node $KILLED_NODE (leader of $APP-$name-in/0)"
        latency_run "$name" "$BROKER_KILL_ROWS" "$@" -- \
            --fault "'$KAFKA_SCRIPT' kill $KILLED_NODE" --fault-after "$BROKER_KILL_AFTER_S" --stall-s 600
        restart_killed_node
    }
    broker_kill_run ks-kill-alos exec_ks_app --application-id "$APP-ks-kill-alos" --caching off
    broker_kill_run kstate-kill-alos exec_kstate_app --application-id "$APP-kstate-kill-alos"
    broker_kill_run ks-kill-eos exec_ks_app --application-id "$APP-ks-kill-eos" --caching off --guarantee exactly-once
    broker_kill_run kstate-kill-eos exec_kstate_app --application-id "$APP-kstate-kill-eos" --guarantee exactly-once
    # <next>/<every>/<max> ms of the fault line.
    recovered() {
        field "$1" 's/^e2e fault .* next_output_ms=\([0-9-]*\) every_partition_ms=\([0-9-]*\) max_visible_ms=\([0-9-]*\)$/\1\/\2\/\3/p' \
            "e2e fault line"
    }
    broker_kill_alos="kafka-streams=$(recovered "$LOG_DIR/ks-kill-alos.latency")ms kstate=$(recovered "$LOG_DIR/kstate-kill-alos.latency")ms"
    broker_kill_eos="kafka-streams=$(recovered "$LOG_DIR/ks-kill-eos.latency")ms kstate=$(recovered "$LOG_DIR/kstate-kill-eos.latency")ms"
    [[ ${KEEP_TOPICS:-0} != 0 ]] || delete_topics "${latency_topics[@]}"
fi

# ------------------------------------------------------------------ e. the failover

failover_line=
if [[ $want_failover == 1 ]]; then
    log "e. failover (failover.sh; logs in $LOG_DIR/failover)"
    KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP KSTATE_E2E=$E2E_BIN KSTATE_COUNT_BY_KEY=$COUNT_BIN \
        LOG_DIR=$LOG_DIR/failover FAILOVER_MODE=takeover "$HERE/failover.sh" | tee "$LOG_DIR/failover.out"
    failover_line=$(grep '^failover kafka-streams=' "$LOG_DIR/failover.out" | tail -n 1)
    [[ -n $failover_line ]] || die "failover.sh printed no result line"
    touch_lease
fi

failover_standby_line=
if [[ $want_failover_standby == 1 ]]; then
    log "e'. failover with a standby replica on both (failover.sh, FAILOVER_STANDBYS=1; logs in $LOG_DIR/failover-standby)"
    KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP KSTATE_E2E=$E2E_BIN KSTATE_COUNT_BY_KEY=$COUNT_BIN \
        LOG_DIR=$LOG_DIR/failover-standby FAILOVER_MODE=takeover FAILOVER_STANDBYS=1 "$HERE/failover.sh" | tee "$LOG_DIR/failover-standby.out"
    failover_standby_line=$(grep '^failover-standby kafka-streams=' "$LOG_DIR/failover-standby.out" | tail -n 1)
    [[ -n $failover_standby_line ]] || die "failover.sh (standbys) printed no result line"
    touch_lease
fi

# ------------------------------------------------------------------ f. the recovery, exactly-once

recovery_line=
if [[ $want_recovery == 1 ]]; then
    log "f. recovery under exactly-once (failover.sh, FAILOVER_MODE=restart; logs in $LOG_DIR/recovery)"
    KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP KSTATE_E2E=$E2E_BIN KSTATE_COUNT_BY_KEY=$COUNT_BIN \
        LOG_DIR=$LOG_DIR/recovery FAILOVER_MODE=restart "$HERE/failover.sh" | tee "$LOG_DIR/recovery.out"
    recovery_line=$(grep '^recovery-eos kafka-streams=' "$LOG_DIR/recovery.out" | tail -n 1)
    [[ -n $recovery_line ]] || die "failover.sh (restart) printed no result line"
    touch_lease
fi

# ------------------------------------------------------------------ g. the comparison

echo
if [[ $want_base == 1 && -n $ks_acked ]]; then
    # Secondary: each side's clock until the changelog holds every put (kstate: put calls plus
    # close; kafka-streams: first put until the changelog's end offset reaches ROWS).
    kstate_durable=$(rate "$ROWS" $((kstate_puts_ms + kstate_flush_ms)))
    echo "puts-until-changelog-complete kafka-streams=$ks_acked/s kstate=$kstate_durable/s" \
        "ratio=$(ratio "$kstate_durable" "$ks_acked")"
fi
if [[ $want_base == 1 ]]; then
    echo "restore kafka-streams=$ks_restore/s kstate=$kstate_restore/s ratio=$(ratio "$kstate_restore" "$ks_restore")"
    echo "puts kafka-streams=$ks_puts/s kstate=$kstate_puts/s ratio=$(ratio "$kstate_puts" "$ks_puts")"
fi
if [[ $want_e2e == 1 ]]; then
    echo "e2e-alos kafka-streams=$e2e_ks/s kstate=$e2e_kstate/s ratio=$(ratio "$e2e_kstate" "$e2e_ks")"
    echo "e2e-alos-cached kafka-streams=$e2e_ks_cached/s kstate=$e2e_kstate_cached/s ratio=$(ratio "$e2e_kstate_cached" "$e2e_ks_cached")"
    echo "e2e-pipe rdkafka=$e2e_pipe/s kstate=$e2e_kstate/s ratio=$(ratio "$e2e_kstate" "$e2e_pipe")"
fi
if [[ $want_e2e == 1 ]]; then
    resources_line resources-alos ks-uncached kstate-uncached
fi
if [[ $want_eos == 1 ]]; then
    resources_line resources-eos ks-eos kstate-eos
    echo "e2e-eos kafka-streams=$e2e_ks_eos/s kstate=$e2e_kstate_eos/s ratio=$(ratio "$e2e_kstate_eos" "$e2e_ks_eos")"
    echo "e2e-eos-overhead kstate-alos=$e2e_kstate/s kstate-eos=$e2e_kstate_eos/s eos/alos=$(ratio "$e2e_kstate_eos" "$e2e_kstate")"
fi
if [[ $want_windowed == 1 ]]; then
    echo "windowed-alos $windowed_alos ratio=$(windowed_ratio win-alos)"
    echo "windowed-eos $windowed_eos ratio=$(windowed_ratio win-eos)"
    echo "windowed-final $windowed_final ratio=$(windowed_ratio win-final)"
fi
if [[ -n $failover_line ]]; then
    echo "$failover_line"
fi
if [[ -n $failover_standby_line ]]; then
    echo "$failover_standby_line"
fi
if [[ -n $recovery_line ]]; then
    echo "$recovery_line"
fi
if [[ -n $latency_alos ]]; then
    echo "latency-alos $latency_alos (visible p50/p95/p99/p99.9)"
    echo "latency-eos $latency_eos (visible p50/p95/p99/p99.9)"
fi
if [[ -n $broker_kill_alos ]]; then
    echo "broker-kill-alos $broker_kill_alos (next output/every partition/slowest visible)"
    echo "broker-kill-eos $broker_kill_eos (next output/every partition/slowest visible)"
fi
