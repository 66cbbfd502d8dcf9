#!/usr/bin/env bash
# benches/kafka-streams/tasks.sh [N ...]: what many tasks cost one process, kstate against Kafka
# Streams on one broker. For each N (default 10 100 1000), one after the other:
#   1. kstate's tasks_per_process --partitions N (a kstate-bench binary): a count-by-key
#      application whose every task has STORES stores (each counts every record of the task:
#      get + 1, put; the last count goes to an N-partition output), on a fresh input of N
#      partitions holding RECORDS_PER_PARTITION records each (keys k0..k3, produced before the
#      clock starts), THREADS worker threads, coalescing off; started on an empty state dir
#      ("fresh"): the time until every one of the N tasks runs, and until the group's committed
#      input offsets sum to every record; stopped; started again on the state it left
#      ("restart"): the time until every task runs; each start also prints the process's RSS,
#      threads, open fds and RocksDB instances;
#   2. the same on Kafka Streams 4.1.1 (this folder's jar, `tasks` mode: Processor API, the
#      STORES stores per task persistent RocksDB key-value stores, logging on, caching off,
#      at_least_once, num.stream.threads=THREADS, no standby, default commit interval;
#      "every task runs": the client RUNNING, THREADS stream threads RUNNING, N active tasks
#      in metadataForLocalThreads; with the state updater a stream thread is RUNNING only once
#      none of its active tasks restores any more). Each side creates and deletes its own
#      topics (input, output, changelogs), group and state dir.
# The last lines, for each N (a side that failed shows failed(<reason>), e.g.
# failed(too-many-open-files), failed(timeout), failed(out-of-memory)):
#   tasks-open n=<N> start=fresh kafka-streams=<s>s kstate=<s>s ratio=<kafka-streams/kstate>
#   tasks-open n=<N> start=restart kafka-streams=<s>s kstate=<s>s ratio=<kafka-streams/kstate>
#   tasks-rss n=<N> start=<fresh|restart> kafka-streams=<MB> kstate=<MB>
#   tasks-threads n=<N> start=<fresh|restart> kafka-streams=<n> kstate=<n>
#   tasks-fds n=<N> start=<fresh|restart> kafka-streams=<n> kstate=<n>
#   tasks-rocksdb n=<N> start=<fresh|restart> kafka-streams=<n> kstate=<n>
# (kstate keeps one RocksDB for every task of the process, a column family per store and a key
# prefix per task; Kafka Streams one per store per task.) The time until every record was processed is in the raw outputs (processed_s); it is
# not compared, as Kafka Streams commits every 30 s by default under at_least_once and kstate
# every 100 ms (KS_COMMIT_INTERVAL_MS sets Kafka Streams').
#
# A process holding many tasks needs many file descriptors (Kafka Streams: several per RocksDB,
# i.e. per store and task; kstate's do not grow with the tasks): check `ulimit -n` before
# N=1000. The script prints it.
#
# Environment:
#   KAFKA_BOOTSTRAP_SERVERS   the broker (else scripts/kafka start; stopped at the end only if
#                             this script started it). CLIENT_PROPERTIES is not supported:
#                             tasks_per_process takes no client properties file.
#   KSTATE_TASKS_PER_PROCESS  kstate's binary (default
#                             $HOME/.cache/kstate-target/release/tasks_per_process)
#   KS_JAVA_OPTS              extra JVM options for the Kafka Streams runs (space-separated)
#   STORES (3), RECORDS_PER_PARTITION (10), THREADS (2)
#                             the same for both sides
#   DEADLINE_S (600)          how long one start may take, on both sides, before it fails
#   KS_COMMIT_INTERVAL_MS     Kafka Streams' commit.interval.ms (default: its default, 30000)
#   LOG_DIR                   raw outputs (default a new temp dir, kept):
#                             kstate-<N>.out/.err, kafka-streams-<N>.out/.err
set -euo pipefail

SCRIPT_NAME=tasks.sh
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
KSTATE_BIN=${KSTATE_TASKS_PER_PROCESS:-$HOME/.cache/kstate-target/release/tasks_per_process}
STORES=${STORES:-3}
RECORDS_PER_PARTITION=${RECORDS_PER_PARTITION:-10}
THREADS=${THREADS:-2}
DEADLINE_S=${DEADLINE_S:-600}
read -r -a JAVA_OPTS <<<"${KS_JAVA_OPTS:-}"
SIZES=("$@")
((${#SIZES[@]} > 0)) || SIZES=(10 100 1000)

for v in "${SIZES[@]}" "$STORES" "$THREADS" "$DEADLINE_S"; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || die "partition counts, STORES, THREADS and DEADLINE_S must be positive whole numbers (got '$v')"
done
[[ $RECORDS_PER_PARTITION =~ ^[0-9]+$ ]] || die "RECORDS_PER_PARTITION must be a whole number (got '$RECORDS_PER_PARTITION')"
[[ -z ${KS_COMMIT_INTERVAL_MS:-} || $KS_COMMIT_INTERVAL_MS =~ ^[0-9]+$ ]] ||
    die "KS_COMMIT_INTERVAL_MS must be a whole number (got '$KS_COMMIT_INTERVAL_MS')"
[[ -z ${CLIENT_PROPERTIES:-} ]] ||
    die "CLIENT_PROPERTIES is not supported: tasks_per_process takes no client properties file"
[[ -x $KSTATE_BIN ]] || die "$KSTATE_BIN is missing; build it with:
  cd $ROOT && CARGO_TARGET_DIR=\$HOME/.cache/kstate-target cargo build --release --workspace --all-targets"
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/kstate-tasks.XXXXXX")}
mkdir -p "$LOG_DIR"

ensure_jar "$LOG_DIR/mvn.log"
trap stop_started_broker EXIT
broker_up
KS_EXTRA=()
[[ -z ${KS_COMMIT_INTERVAL_MS:-} ]] || KS_EXTRA=(--commit-interval-ms "$KS_COMMIT_INTERVAL_MS")
log "broker $BOOTSTRAP; N=${SIZES[*]}; $STORES stores per task, $RECORDS_PER_PARTITION records per partition," \
    "$THREADS threads; ulimit -n $(ulimit -n) (hard $(ulimit -Hn)); logs in $LOG_DIR"

# failure OUT ERR RC: why a side's run failed, one word: its tasks-failed line's reason (the
# jar), else a known message in its stderr, else exit-RC.
failure() {
    local out=$1 err=$2 rc=$3 reason
    reason=$(sed -n 's/^tasks-failed .*reason=\([^ ]*\).*/\1/p' "$out" | head -n 1)
    if [[ -z $reason ]]; then
        if grep -qi 'too many open files' "$err"; then
            reason=too-many-open-files
        elif grep -qiE 'OutOfMemoryError|out of memory|cannot allocate memory' "$err"; then
            reason=out-of-memory
        elif grep -qE 'start: not (every task running|every record processed) in|timed? ?out' "$err"; then
            reason=timeout
        elif ((rc > 128)); then
            reason=signal-$((rc - 128))
        else
            reason=exit-$rc
        fi
    fi
    printf '%s' "$reason"
}

for n in "${SIZES[@]}"; do
    log "N=$n: kstate"
    rc=0
    KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP "$KSTATE_BIN" --partitions "$n" --stores "$STORES" \
        --records-per-partition "$RECORDS_PER_PARTITION" --threads "$THREADS" --deadline-s "$DEADLINE_S" \
        --bootstrap-servers "$BOOTSTRAP" >"$LOG_DIR/kstate-$n.out" 2>"$LOG_DIR/kstate-$n.err" || rc=$?
    cat "$LOG_DIR/kstate-$n.out" >&2
    ((rc == 0)) || printf -v "FAILED_kstate_$n" '%s' "$(failure "$LOG_DIR/kstate-$n.out" "$LOG_DIR/kstate-$n.err" "$rc")"
    touch_lease

    log "N=$n: kafka-streams"
    rc=0
    # Its state dir (a temp dir) in a folder of this run's: a JVM that dies leaves it behind,
    # 3,000 RocksDBs at N=1000.
    ks_tmp=$LOG_DIR/kafka-streams-$n.tmp
    mkdir -p "$ks_tmp"
    java "${JAVA_OPTS[@]}" -Djava.io.tmpdir="$ks_tmp" -jar "$JAR" tasks --bootstrap "$BOOTSTRAP" --partitions "$n" --stores "$STORES" \
        --records-per-partition "$RECORDS_PER_PARTITION" --threads "$THREADS" --deadline-s "$DEADLINE_S" \
        "${KS_EXTRA[@]}" >"$LOG_DIR/kafka-streams-$n.out" 2>"$LOG_DIR/kafka-streams-$n.err" &
    pid=$!
    wait "$pid" || rc=$?
    cat "$LOG_DIR/kafka-streams-$n.out" >&2
    rm -rf "$ks_tmp"
    if ((rc != 0)); then
        printf -v "FAILED_kafka_streams_$n" '%s' \
            "$(failure "$LOG_DIR/kafka-streams-$n.out" "$LOG_DIR/kafka-streams-$n.err" "$rc")"
        # A JVM that died (N=1000 ran out of file descriptors and aborted in its close) cleaned
        # up nothing: its application id is tasks-N-<its pid>-<time>-ks.
        "$KAFKA_SCRIPT" run-class org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" \
            --delete --if-exists --topic "tasks-$n-$pid-.*-ks-.*" >>"$LOG_DIR/kafka-streams-$n.err" 2>&1 ||
            log "could not delete the topics tasks-$n-$pid-*-ks-* the failed Kafka Streams run left"
    fi
    touch_lease
done

# field SYSTEM N START PREFIX KEY: KEY's value on SYSTEM's PREFIX line for N and START, else
# failed(<reason>) (or "missing" when the run succeeded but has no such line).
field() {
    local system=$1 n=$2 start=$3 prefix=$4 key=$5 value failed
    value=$(awk -v p="$prefix" -v n="n=$n" -v s="start=$start" -v k="$key=" '
        $1 == p && $2 == n && $3 == s { for (i = 4; i <= NF; i++) if (index($i, k) == 1) { print substr($i, length(k) + 1); exit } }
    ' "$LOG_DIR/$system-$n.out")
    if [[ -n $value ]]; then
        printf '%s' "$value"
        return
    fi
    failed=FAILED_${system//-/_}_$n
    if [[ -n ${!failed:-} ]]; then printf 'failed(%s)' "${!failed}"; else printf 'missing'; fi
}

numeric() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }

for n in "${SIZES[@]}"; do
    for start in fresh restart; do
        ks=$(field kafka-streams "$n" "$start" tasks-open running_s)
        kst=$(field kstate "$n" "$start" tasks-open running_s)
        ratio=n/a
        if numeric "$ks" && numeric "$kst"; then
            ratio=$(awk -v a="$ks" -v b="$kst" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
        fi
        numeric "$ks" && ks=${ks}s
        numeric "$kst" && kst=${kst}s
        echo "tasks-open n=$n start=$start kafka-streams=$ks kstate=$kst ratio=$ratio"
    done
    for what in rss:rss_mb threads:threads fds:fds rocksdb:rocksdb; do
        for start in fresh restart; do
            echo "tasks-${what%%:*} n=$n start=$start" \
                "kafka-streams=$(field kafka-streams "$n" "$start" tasks-resources "${what#*:}")" \
                "kstate=$(field kstate "$n" "$start" tasks-resources "${what#*:}")"
        done
    done
done
