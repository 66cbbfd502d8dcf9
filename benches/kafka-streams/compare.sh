#!/usr/bin/env bash
# benches/kafka-streams/compare.sh [ROWS]: kstate against Kafka Streams on one broker.
#
#   1. kstate's rows_per_second example (logged-group) puts ROWS rows into its logged store,
#      whose changelog is APP-store-changelog, then restores that changelog into an empty dir;
#   2. a Kafka Streams app (this folder's jar, `restore` mode) restores the very same topic into
#      its own persistent (RocksDB) store;
#   3. the same app in `puts` mode puts ROWS records into a logged store through a topology;
#   4. the last two lines compare the rates:
#        restore kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#        puts kafka-streams=<r>/s kstate=<r>/s ratio=<kstate/kafka-streams>
#
# ROWS: the first argument, else $ROWS, else 1000000.
# Environment:
#   KAFKA_BOOTSTRAP_SERVERS  use this broker; otherwise scripts/kafka start (stopped at the end
#                            only if this script started it)
#   KSTATE_ROWS_PER_SECOND   kstate's example binary (default
#                            $HOME/.cache/kstate-target/release/examples/rows_per_second)
#   KS_JAVA_OPTS             extra JVM options for the Kafka Streams runs (space-separated)
#   KEEP_TOPICS=1            keep the topics (and consumer groups) instead of deleting them
#   LOG_DIR                  where the raw outputs go (default: a new temp dir, kept)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd "$HERE/../.." && pwd -P)
KAFKA_SCRIPT=$ROOT/scripts/kafka
ROWS=${1:-${ROWS:-1000000}}
ROWS=${ROWS//_/}
KSTATE_BIN=${KSTATE_ROWS_PER_SECOND:-$HOME/.cache/kstate-target/release/examples/rows_per_second}
JAR=$HERE/target/kstate-kafka-streams-bench.jar
STORE=store
APP=kstate-vs-ks-$(date +%s)-$$
CHANGELOG=$APP-$STORE-changelog
read -r -a JAVA_OPTS <<<"${KS_JAVA_OPTS:-}"
DELETE_TOPICS=(--delete-topics)
[[ ${KEEP_TOPICS:-0} == 0 ]] || DELETE_TOPICS=()

log() { printf 'compare.sh: %s\n' "$*" >&2; }
die() { printf 'compare.sh: error: %s\n' "$*" >&2; exit 1; }

[[ $ROWS =~ ^[1-9][0-9]*$ ]] || die "ROWS must be a positive whole number (got '$ROWS')"

if [[ ! -x $KSTATE_BIN ]]; then
    cat >&2 <<EOF
compare.sh: kstate's example binary is missing: $KSTATE_BIN
Build it with:
  cd $ROOT && CARGO_TARGET_DIR=\$HOME/.cache/kstate-target cargo build --release --workspace --all-targets
(or set KSTATE_ROWS_PER_SECOND to a built rows_per_second binary)
EOF
    exit 1
fi
command -v java >/dev/null 2>&1 || die "java (17+) is required: apt-get install -y openjdk-17-jdk-headless"

LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/kstate-vs-kafka-streams.XXXXXX")}
mkdir -p "$LOG_DIR"

# ------------------------------------------------------------------ the Java side

jar_is_stale() {
    [[ -f $JAR ]] || return 0
    [[ -n $(find "$HERE/pom.xml" "$HERE/src" -newer "$JAR" -print -quit) ]]
}

if jar_is_stale; then
    command -v mvn >/dev/null 2>&1 || die "maven is required to build $JAR: apt-get install -y maven"
    log "building $JAR (mvn package; log: $LOG_DIR/mvn.log)"
    # Offline first: after the first build everything is in ~/.m2.
    if ! mvn -B -q -o -f "$HERE/pom.xml" package >"$LOG_DIR/mvn.log" 2>&1; then
        mvn -B -q -f "$HERE/pom.xml" package >>"$LOG_DIR/mvn.log" 2>&1 || {
            tail -n 40 "$LOG_DIR/mvn.log" >&2
            die "mvn package failed (log: $LOG_DIR/mvn.log)"
        }
    fi
fi

# ------------------------------------------------------------------ the broker

STARTED_BROKER=0
cleanup() {
    if [[ $STARTED_BROKER == 1 ]]; then
        log "stopping the broker this script started"
        "$KAFKA_SCRIPT" stop >&2 || log "warning: scripts/kafka stop failed"
    fi
}
trap cleanup EXIT

if [[ -n ${KAFKA_BOOTSTRAP_SERVERS:-} ]]; then
    BOOTSTRAP=$KAFKA_BOOTSTRAP_SERVERS
    USE_SCRIPT=0
else
    USE_SCRIPT=1
    if ! "$KAFKA_SCRIPT" status >/dev/null 2>&1; then
        STARTED_BROKER=1
    fi
    BOOTSTRAP=$("$KAFKA_SCRIPT" start | tail -n 1)
fi
[[ -n $BOOTSTRAP ]] || die "no broker address"
log "broker $BOOTSTRAP; rows $ROWS; app $APP; raw outputs in $LOG_DIR"

# Keeps scripts/kafka's idle watchdog away during long runs.
touch_lease() {
    if [[ $USE_SCRIPT == 1 ]]; then "$KAFKA_SCRIPT" touch >/dev/null 2>&1 || true; fi
}

# field FILE SED_EXPRESSION WHAT: the one value the expression captures, or die.
field() {
    local v
    v=$(sed -n "$2" "$1" | tail -n 1)
    [[ -n $v ]] || die "no $3 in $1"
    printf '%s\n' "$v"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
rate() { awk -v n="$1" -v ms="$2" 'BEGIN { printf "%.0f", n / (ms / 1000) }'; }

# ------------------------------------------------------------------ a. kstate

log "a. kstate: rows_per_second --configs logged-group --rows $ROWS --restore-topic $CHANGELOG"
KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP "$KSTATE_BIN" --configs logged-group --rows "$ROWS" \
    --restore-topic "$CHANGELOG" 2>&1 | tee "$LOG_DIR/kstate.log"
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
    --store "$STORE" "${DELETE_TOPICS[@]}" 2>&1 | tee "$LOG_DIR/kafka-streams-restore.log"
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
    --application-id "$APP-puts" --store "$STORE" "${DELETE_TOPICS[@]}" 2>&1 |
    tee "$LOG_DIR/kafka-streams-puts.log"
ks_puts=$(field "$LOG_DIR/kafka-streams-puts.log" \
    's/^kafka-streams puts rows=[0-9]* ms=[0-9]* rows_per_sec=\([0-9]*\)$/\1/p' \
    "kafka-streams puts line")
ks_acked=$(sed -n 's/^kafka-streams puts changelog-acked rows=[0-9]* ms=[0-9]* rows_per_sec=\([0-9]*\) .*/\1/p' \
    "$LOG_DIR/kafka-streams-puts.log" | tail -n 1)
touch_lease

# ------------------------------------------------------------------ d. the comparison

echo
if [[ -n $ks_acked ]]; then
    # Secondary: each side's clock until the changelog holds every put (kstate: put calls plus
    # close; kafka-streams: first put until the changelog's end offset reaches ROWS).
    kstate_durable=$(rate "$ROWS" $((kstate_puts_ms + kstate_flush_ms)))
    echo "puts-until-changelog-complete kafka-streams=$ks_acked/s kstate=$kstate_durable/s" \
        "ratio=$(ratio "$kstate_durable" "$ks_acked")"
fi
echo "restore kafka-streams=$ks_restore/s kstate=$kstate_restore/s ratio=$(ratio "$kstate_restore" "$ks_restore")"
echo "puts kafka-streams=$ks_puts/s kstate=$kstate_puts/s ratio=$(ratio "$kstate_puts" "$ks_puts")"
