# benches/kafka-streams/lib.sh: what compare.sh and failover.sh share; sourced, not run.
#
# Before sourcing: SCRIPT_NAME (for messages).
# Gives: HERE (this folder), ROOT (the checkout), KAFKA_SCRIPT (scripts/kafka), log, die, JAR
# and ensure_jar (the Kafka Streams side, rebuilt when its sources are newer), broker_up (sets BOOTSTRAP:
# CLIENT_PROPERTIES's bootstrap.servers if that file is given, else KAFKA_BOOTSTRAP_SERVERS if set,
# else scripts/kafka start),
# stop_started_broker (for an EXIT trap: stops the broker only if broker_up started it),
# touch_lease (keeps scripts/kafka's idle watchdog away during long runs).

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd "$HERE/../.." && pwd -P)
KAFKA_SCRIPT=$ROOT/scripts/kafka

log() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() { printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2; exit 1; }

JAR=$HERE/target/kstate-kafka-streams-bench.jar

# ensure_jar LOG: builds the jar if it is missing or older than its sources (mvn output to LOG).
ensure_jar() {
    local mvn_log=$1
    command -v java >/dev/null 2>&1 || die "java (17+) is required: apt-get install -y openjdk-17-jdk-headless"
    if [[ -f $JAR && -z $(find "$HERE/pom.xml" "$HERE/src" -newer "$JAR" -print -quit) ]]; then
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || die "maven is required to build $JAR: apt-get install -y maven"
    log "building $JAR (mvn package; log: $mvn_log)"
    # Offline first: after the first build everything is in ~/.m2.
    if ! mvn -B -q -o -f "$HERE/pom.xml" package >"$mvn_log" 2>&1; then
        mvn -B -q -f "$HERE/pom.xml" package >>"$mvn_log" 2>&1 || {
            tail -n 40 "$mvn_log" >&2
            die "mvn package failed (log: $mvn_log)"
        }
    fi
}

STARTED_BROKER=0
USE_SCRIPT=0
broker_up() {
    if [[ -n ${CLIENT_PROPERTIES:-} ]]; then
        # A secured (or any) broker described by a librdkafka properties file: its
        # bootstrap.servers is the broker; the file itself goes to every client.
        [[ -r $CLIENT_PROPERTIES ]] || die "CLIENT_PROPERTIES=$CLIENT_PROPERTIES is not a readable file"
        CLIENT_PROPERTIES=$(cd "$(dirname "$CLIENT_PROPERTIES")" && pwd -P)/$(basename "$CLIENT_PROPERTIES")
        BOOTSTRAP=$(sed -n 's/^[[:space:]]*bootstrap\.servers[[:space:]]*=[[:space:]]*//p' "$CLIENT_PROPERTIES" | tail -n 1)
        [[ -n $BOOTSTRAP ]] || die "$CLIENT_PROPERTIES has no bootstrap.servers"
    elif [[ -n ${KAFKA_BOOTSTRAP_SERVERS:-} ]]; then
        BOOTSTRAP=$KAFKA_BOOTSTRAP_SERVERS
    else
        USE_SCRIPT=1
        "$KAFKA_SCRIPT" status >/dev/null 2>&1 || STARTED_BROKER=1
        BOOTSTRAP=$("$KAFKA_SCRIPT" start | tail -n 1)
    fi
    [[ -n $BOOTSTRAP ]] || die "no broker address"
}

stop_started_broker() {
    if [[ $STARTED_BROKER == 1 ]]; then
        log "stopping the broker this script started"
        "$KAFKA_SCRIPT" stop >&2 || log "warning: scripts/kafka stop failed"
    fi
}

touch_lease() {
    if [[ $USE_SCRIPT == 1 ]]; then "$KAFKA_SCRIPT" touch >/dev/null 2>&1 || true; fi
}
