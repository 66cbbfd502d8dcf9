#!/usr/bin/env bash
# benches/kafka-streams/window-compat.sh: a window changelog written by Kafka Streams restores
# into kstate window stores with the same (key, window) -> count as Kafka Streams' own store.
#
#   1. `window_compat produce` (crates/kstate-bench/src/bin/window_compat.rs) writes RECORDS
#      records over KEYS keys (k0000..) into a fresh PARTITIONS-partition input, with event
#      timestamps spread over the last MINUTES one-minute windows: mostly a little out of order,
#      5% late by up to 20 s (many within the 10 s grace), 5% late by 20 s to 5 min (dropped by
#      Kafka Streams);
#   2. this folder's jar, `WindowBench window-count`, runs
#      `groupByKey().windowedBy(TimeWindows.ofSizeAndGrace(1 min, 10 s)).count()` (RocksDB
#      window store "counts", retention RETENTION_MS, caching CACHING) over it until every record
#      is processed, dumps the store through interactive queries (kafka-streams.txt), and closes;
#      then a second instance with an empty state directory restores the store from the
#      changelog APP-counts-changelog and dumps it again (kafka-streams-restored.txt);
#   3. `window_compat restore` restores every partition of that changelog into fresh kstate
#      window stores with the same size, grace and retention (kstate-kafka's restore with
#      WindowChangelog keys) and dumps them the same way (kstate.txt);
#   4. the dumps (sorted `key<TAB>window start<TAB>count` lines) are compared:
#        window-compat kafka-streams-windows=<n> kstate-windows=<n> identical=yes|no
#      compares kstate's restore with Kafka Streams' live store, and
#        window-compat-restored kafka-streams-restored-windows=<n> identical=yes|no
#      kstate's with Kafka Streams' own restore of the same changelog. On a difference the
#      first differing lines are printed and the exit status is 1.
#
# With the default retention (a day) every window of the input is live in both stores, so the
# comparison covers all of them. A retention shorter than the input's span compares the
# retention boundary too: which windows each system still shows once stream time has moved on
# (docs/runtime.md, "Time in state", says where the two differ).
#
# Environment:
#   RECORDS (200000), KEYS (1000), MINUTES (30), PARTITIONS (4)   the input
#   RETENTION_MS   the store's retention on both sides (default 86400000; "default": Kafka
#                  Streams' default for a windowed aggregation, size + grace, which is kstate's
#                  default too)
#   CACHING        the Kafka Streams store's cache, on (the DSL's default) or off
#   KAFKA_BOOTSTRAP_SERVERS  the broker (plaintext); otherwise scripts/kafka start (stopped at
#                  the end only if this script started it)
#   KSTATE_WINDOW_COMPAT     kstate's window_compat binary (default: kstate-bench's, built with
#                  cargo into $CARGO_TARGET_DIR/release, default ~/.cache/kstate-target)
#   KS_JAVA_OPTS   extra JVM options (space-separated)
#   KEEP_TOPICS=1  keep the input, the changelog and the consumer group
#   LOG_DIR        where the dumps and logs go (default: a new temp dir, kept)
set -euo pipefail

SCRIPT_NAME=window-compat.sh
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RECORDS=${RECORDS:-200000}
RECORDS=${RECORDS//_/}
KEYS=${KEYS:-1000}
MINUTES=${MINUTES:-30}
PARTITIONS=${PARTITIONS:-4}
RETENTION_MS=${RETENTION_MS:-86400000}
RETENTION_MS=${RETENTION_MS//_/}
CACHING=${CACHING:-on}
read -r -a JAVA_OPTS <<<"${KS_JAVA_OPTS:-}"
APP=window-compat-$(date +%s)-$$
INPUT=$APP-input
CHANGELOG=$APP-counts-changelog

for n in RECORDS KEYS MINUTES PARTITIONS; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "$n must be a positive whole number (got '${!n}')"
done
[[ $RETENTION_MS == default || $RETENTION_MS =~ ^[1-9][0-9]*$ ]] \
    || die "RETENTION_MS must be a number of ms or 'default' (got '$RETENTION_MS')"
[[ $CACHING == on || $CACHING == off ]] || die "CACHING must be on or off (got '$CACHING')"
[[ -z ${CLIENT_PROPERTIES:-} ]] || die "window-compat.sh runs against a plaintext broker (unset CLIENT_PROPERTIES)"

RETENTION_FLAG=()
[[ $RETENTION_MS == default ]] || RETENTION_FLAG=(--retention-ms "$RETENTION_MS")

LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/kstate-window-compat.XXXXXX")}
mkdir -p "$LOG_DIR"
STARTED=$(date +%s)

# ------------------------------------------------------------------ builds, the broker

ensure_jar "$LOG_DIR/mvn.log"
if [[ -n ${KSTATE_WINDOW_COMPAT:-} ]]; then
    WINDOW_COMPAT=$KSTATE_WINDOW_COMPAT
else
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/kstate-target}
    # The workspace's binaries and examples, not `-p kstate-bench` alone: a build of one package
    # resolves its dependencies' features differently from the workspace builds (scripts/test,
    # the README's), and that would compile RocksDB again; this one is a no-op after them.
    log "cargo build --release --workspace --bins --examples (log: $LOG_DIR/cargo.log)"
    (cd "$ROOT" && cargo build --release --workspace --bins --examples) >"$LOG_DIR/cargo.log" 2>&1 || {
        tail -n 40 "$LOG_DIR/cargo.log" >&2
        die "cargo build failed (log: $LOG_DIR/cargo.log)"
    }
    WINDOW_COMPAT=$CARGO_TARGET_DIR/release/window_compat
fi
[[ -x $WINDOW_COMPAT ]] || die "no window_compat binary at $WINDOW_COMPAT"

cleanup() {
    if [[ ${KEEP_TOPICS:-0} == 0 ]]; then
        KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP "$WINDOW_COMPAT" delete --topics "$INPUT,$CHANGELOG" \
            --groups "$APP" >>"$LOG_DIR/delete.log" 2>&1 || log "could not delete $INPUT, $CHANGELOG (log: $LOG_DIR/delete.log)"
    else
        log "kept topics $INPUT, $CHANGELOG and group $APP"
    fi
    stop_started_broker
}
broker_up
trap cleanup EXIT
log "broker $BOOTSTRAP; app $APP; $RECORDS records over $KEYS keys, $MINUTES minutes, $PARTITIONS partitions;" \
    "retention $RETENTION_MS, caching $CACHING; logs and dumps in $LOG_DIR"

wc_() { KAFKA_BOOTSTRAP_SERVERS=$BOOTSTRAP "$WINDOW_COMPAT" "$@"; }

# ------------------------------------------------------------------ 1. the input

wc_ produce --input "$INPUT" --partitions "$PARTITIONS" --records "$RECORDS" --keys "$KEYS" \
    --minutes "$MINUTES" 2>&1 | tee "$LOG_DIR/produce.log" >&2
touch_lease

# ------------------------------------------------------------------ 2. Kafka Streams

# Kafka Streams logs a warning per late record it drops: errors only from that class.
java -Dorg.slf4j.simpleLogger.log.org.apache.kafka.streams.kstream.internals.KStreamWindowAggregate=error \
    "${JAVA_OPTS[@]}" -cp "$JAR" kstate.bench.WindowBench window-count --bootstrap "$BOOTSTRAP" \
    --application-id "$APP" --input "$INPUT" --records "$RECORDS" --caching "$CACHING" \
    "${RETENTION_FLAG[@]}" --out "$LOG_DIR/kafka-streams.txt" \
    --restored-out "$LOG_DIR/kafka-streams-restored.txt" >"$LOG_DIR/kafka-streams.log" 2>&1 || {
    tail -n 40 "$LOG_DIR/kafka-streams.log" >&2
    die "WindowBench window-count failed (log: $LOG_DIR/kafka-streams.log)"
}
grep '^kafka-streams window-count' "$LOG_DIR/kafka-streams.log" >&2 || true
touch_lease

# ------------------------------------------------------------------ 3. kstate

wc_ restore --changelog "$CHANGELOG" --partitions "$PARTITIONS" "${RETENTION_FLAG[@]}" \
    --out "$LOG_DIR/kstate.txt" 2>&1 | tee "$LOG_DIR/kstate.log" >&2

# ------------------------------------------------------------------ 4. the comparison

lines() { wc -l <"$1" | tr -d ' '; }
# same A B WHAT: yes if the dumps are identical; otherwise no, and the first differences.
same() {
    if cmp -s "$1" "$2"; then
        echo yes
    else
        log "$3 differ (< $(basename "$1"), > $(basename "$2")); first differences:"
        diff "$1" "$2" | grep '^[<>]' | head -n 20 >&2 || true
        echo no
    fi
}
ks=$(lines "$LOG_DIR/kafka-streams.txt")
ks_restored=$(lines "$LOG_DIR/kafka-streams-restored.txt")
kstate=$(lines "$LOG_DIR/kstate.txt")
identical=$(same "$LOG_DIR/kafka-streams.txt" "$LOG_DIR/kstate.txt" "Kafka Streams' store and kstate's restore")
identical_restored=$(same "$LOG_DIR/kafka-streams-restored.txt" "$LOG_DIR/kstate.txt" \
    "Kafka Streams' restore and kstate's restore")
log "done in $(($(date +%s) - STARTED)) s"
echo "window-compat-restored kafka-streams-restored-windows=$ks_restored identical=$identical_restored"
echo "window-compat kafka-streams-windows=$ks kstate-windows=$kstate identical=$identical"
[[ $identical == yes && $identical_restored == yes ]]
