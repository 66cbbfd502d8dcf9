package kstate.bench;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileVisitResult;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.SimpleFileVisitor;
import java.nio.file.attribute.BasicFileAttributes;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.TopicConfig;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindowedKStream;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The Kafka Streams side of benches/kafka-streams/compare.sh (and of failover.sh and tasks.sh).
 *
 * <pre>
 * restore --bootstrap B --application-id APP --store STORE [--topology dsl|papi] [--delete-topics]
 * puts    --bootstrap B --rows N [--application-id APP] [--store STORE] [--topology papi|dsl]
 *         [--value-size BYTES] [--seed N] [--delete-topics]
 * tasks   --bootstrap B --partitions N [--stores 3] [--records-per-partition 10] [--threads 2]
 *         [--deadline-s 600] [--commit-interval-ms MS]   (tasks.sh; see {@link #tasks})
 * </pre>
 *
 * <p>Every mode also takes {@code --client-properties FILE}: the librdkafka properties kstate's
 * clients are given (e.g. the sasl_ssl.properties of {@code scripts/kafka start --secure}),
 * translated to the Java clients' names (see {@link #clientProperties}) and given to every client
 * this program creates: Kafka Streams' consumers, producers and admin client, and its own admin
 * client and producer. {@code --bootstrap} may then be left out (the file's bootstrap.servers);
 * given, it wins. No password is ever printed: the translation is printed with secrets as
 * [hidden], and the clients' own config dump (INFO) shows them as [hidden] too.
 *
 * <p>Both modes run one Kafka Streams instance (at_least_once, 1 stream thread, no standby, state
 * dir in a fresh temp dir) whose one persistent key-value store (Stores.persistentKeyValueStore,
 * default RocksDB settings, ByteArray serdes, logging on, caching off) has the changelog
 * APP-STORE-changelog. The topology reads APP-input (1 partition) and puts every record into the
 * store.
 */
public final class KafkaStreamsBench {
    private static final long WAIT_MINUTES = 30;

    /** The Java clients' properties from {@code --client-properties} (empty without it). */
    private static final Properties CLIENT = new Properties();

    private KafkaStreamsBench() {}

    public static void main(String[] argv) throws Exception {
        if (argv.length == 0 || argv[0].equals("--help") || argv[0].equals("-h")) {
            usage();
            System.exit(argv.length == 0 ? 2 : 0);
        }
        Map<String, String> opts = parse(argv);
        if (opts.containsKey("client-properties")) {
            CLIENT.putAll(clientProperties(Path.of(opts.get("client-properties"))));
            System.err.println("kafka-streams: client properties from " + opts.get("client-properties") + ": "
                    + shown(CLIENT));
        }
        int rc;
        switch (argv[0]) {
            case "restore" -> rc = restore(opts);
            case "puts" -> rc = puts(opts);
            case "e2e" -> rc = e2e(opts);
            case "serve" -> rc = serve(opts);
            case "tasks" -> rc = tasks(opts);
            default -> {
                usage();
                rc = 2;
            }
        }
        // Kafka's and RocksDB's threads are all closed by now; exit without waiting for stragglers.
        System.exit(rc);
    }

    private static void usage() {
        System.err.println(
                "usage:\n"
                        + "  restore --bootstrap B --application-id APP --store STORE [--topology dsl|papi]"
                        + " [--delete-topics]\n"
                        + "  puts --bootstrap B --rows N [--application-id APP] [--store STORE]"
                        + " [--topology papi|dsl] [--value-size BYTES] [--seed N] [--delete-topics]\n"
                        + "  e2e --bootstrap B --application-id APP --input TOPIC --output TOPIC --rows N"
                        + " [--caching on|off] [--guarantee at-least-once|exactly-once]"
                        + " [--topology count|windowed] [--emit updates|final]\n"
                        + "  serve --bootstrap B --application-id APP --input TOPIC --output TOPIC --state-dir DIR"
                        + " [--session-timeout-ms N] [--heartbeat-interval-ms N]"
                        + " [--guarantee at-least-once|exactly-once] [--group-instance-id NAME]"
                        + " [--standby-replicas N]\n"
                        + "  tasks --bootstrap B --partitions N [--stores 3] [--records-per-partition 10]"
                        + " [--threads 2] [--deadline-s 600] [--commit-interval-ms MS]\n"
                        + "every mode: [--client-properties FILE] (librdkafka names; then --bootstrap is optional)");
    }

    private static Map<String, String> parse(String[] argv) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 1; i < argv.length; i++) {
            String flag = argv[i];
            if (!flag.startsWith("--")) {
                throw new IllegalArgumentException("unexpected argument " + flag);
            }
            if (flag.equals("--delete-topics")) {
                opts.put("delete-topics", "true");
                continue;
            }
            if (i + 1 >= argv.length) {
                throw new IllegalArgumentException(flag + " needs a value");
            }
            opts.put(flag.substring(2), argv[++i]);
        }
        return opts;
    }

    private static String required(Map<String, String> opts, String name) {
        String v = opts.get(name);
        if (v == null || v.isEmpty()) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return v;
    }

    /** {@code --bootstrap}, else the client properties' bootstrap.servers. */
    private static String bootstrap(Map<String, String> opts) {
        String v = opts.get("bootstrap");
        if (v == null || v.isEmpty()) {
            v = CLIENT.getProperty("bootstrap.servers");
        }
        if (v == null || v.isEmpty()) {
            throw new IllegalArgumentException("--bootstrap (or bootstrap.servers in --client-properties) is required");
        }
        return v;
    }

    /**
     * A librdkafka properties file ({@code key=value} lines; blank lines and lines starting with #
     * or ! skipped, as kstate's ClientProperties::from_file reads it) as the Java clients'
     * properties: bootstrap.servers and security.protocol as they are; sasl.mechanisms becomes
     * sasl.mechanism; sasl.username and sasl.password become sasl.jaas.config (ScramLoginModule for
     * SCRAM-SHA-256/512, PlainLoginModule for PLAIN); ssl.ca.location becomes a PEM truststore
     * (ssl.truststore.type=PEM, ssl.truststore.location); ssl.endpoint.identification.algorithm
     * as it is ("none": off). Any other property is an error naming the property (never its
     * value): its Java name may differ, and a setting silently dropped is worse than none.
     */
    static Properties clientProperties(Path file) throws IOException {
        Map<String, String> in = new HashMap<>();
        int lineNumber = 0;
        for (String line : Files.readAllLines(file)) {
            lineNumber++;
            String t = line.strip();
            if (t.isEmpty() || t.startsWith("#") || t.startsWith("!")) {
                continue;
            }
            int eq = t.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException(file + ":" + lineNumber + ": expected key=value");
            }
            in.put(t.substring(0, eq).strip(), t.substring(eq + 1).strip());
        }
        Properties out = new Properties();
        String user = null;
        String password = null;
        String mechanism = null;
        for (Map.Entry<String, String> e : in.entrySet()) {
            String value = e.getValue();
            switch (e.getKey()) {
                case "bootstrap.servers" -> out.put("bootstrap.servers", value);
                case "security.protocol" -> out.put("security.protocol", value.toUpperCase(java.util.Locale.ROOT));
                case "sasl.mechanisms", "sasl.mechanism" -> mechanism = value;
                case "sasl.username" -> user = value;
                case "sasl.password" -> password = value;
                case "ssl.ca.location" -> {
                    out.put("ssl.truststore.type", "PEM");
                    out.put("ssl.truststore.location", value);
                }
                case "ssl.endpoint.identification.algorithm" ->
                        out.put("ssl.endpoint.identification.algorithm", value.equals("none") ? "" : value);
                default -> throw new IllegalArgumentException(file + ": " + e.getKey()
                        + " has no Java client equivalent here (known: bootstrap.servers, security.protocol,"
                        + " sasl.mechanisms, sasl.username, sasl.password, ssl.ca.location,"
                        + " ssl.endpoint.identification.algorithm)");
            }
        }
        if (mechanism != null) {
            out.put("sasl.mechanism", mechanism);
        }
        if (user != null || password != null) {
            if (user == null || password == null) {
                throw new IllegalArgumentException(file + ": sasl.username and sasl.password go together");
            }
            String module = switch (mechanism == null ? "GSSAPI" : mechanism) {
                case "SCRAM-SHA-256", "SCRAM-SHA-512" -> "org.apache.kafka.common.security.scram.ScramLoginModule";
                case "PLAIN" -> "org.apache.kafka.common.security.plain.PlainLoginModule";
                default -> throw new IllegalArgumentException(file
                        + ": sasl.username/sasl.password need sasl.mechanisms PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512");
            };
            out.put("sasl.jaas.config", module + " required username=\"" + jaasQuoted(user) + "\" password=\""
                    + jaasQuoted(password) + "\";");
        }
        return out;
    }

    /** A JAAS option value: backslashes and double quotes escaped. */
    private static String jaasQuoted(String v) {
        return v.replace("\\", "\\\\").replace("\"", "\\\"");
    }

    /** {@code props} as {@code key=value, ...}, sorted, with sasl.jaas.config and passwords [hidden]. */
    private static String shown(Properties props) {
        StringBuilder b = new StringBuilder();
        for (String key : new java.util.TreeSet<>(props.stringPropertyNames())) {
            if (b.length() > 0) {
                b.append(", ");
            }
            boolean secret = key.contains("jaas") || key.contains("password") || key.contains("secret");
            b.append(key).append('=').append(secret ? "[hidden]" : props.getProperty(key));
        }
        return b.toString();
    }

    private static long number(Map<String, String> opts, String name, long dflt) {
        String v = opts.get(name);
        return v == null ? dflt : Long.parseLong(v.replace("_", ""));
    }

    // ------------------------------------------------------------------ restore

    private static int restore(Map<String, String> opts) throws Exception {
        String bootstrap = bootstrap(opts);
        String app = required(opts, "application-id");
        String store = required(opts, "store");
        String topology = opts.getOrDefault("topology", "dsl");
        String input = app + "-input";
        String changelog = app + "-" + store + "-changelog";
        Path stateDir = Files.createTempDirectory("kstate-ks-restore-");

        long endOffset;
        try (Admin admin = admin(bootstrap)) {
            Set<String> topics = admin.listTopics().names().get();
            if (!topics.contains(changelog)) {
                System.err.println("changelog topic " + changelog + " does not exist: fill it first");
                return 1;
            }
            TopicDescription d = admin.describeTopics(List.of(changelog)).allTopicNames().get().get(changelog);
            String policy = admin.describeConfigs(List.of(new org.apache.kafka.common.config.ConfigResource(
                            org.apache.kafka.common.config.ConfigResource.Type.TOPIC, changelog)))
                    .all().get().values().iterator().next().get(TopicConfig.CLEANUP_POLICY_CONFIG).value();
            endOffset = endOffset(admin, changelog);
            System.out.printf("changelog %s: partitions=%d cleanup.policy=%s end_offset=%d%n",
                    changelog, d.partitions().size(), policy, endOffset);
            createIfMissing(admin, input);
        }

        RestoreTimer timer = new RestoreTimer();
        Properties props = streamsProps(bootstrap, app, stateDir);
        KafkaStreams streams = new KafkaStreams(topology(topology, input, store, null), props);
        AtomicReference<Throwable> failure = watch(streams);
        streams.setGlobalStateRestoreListener(timer);
        int rc = 0;
        try {
            streams.start();
            if (!await(timer.done, failure, streams)) {
                System.err.println("kafka-streams: the restore did not finish: "
                        + (failure.get() != null ? failure.get() : "state " + streams.state()));
                rc = 1;
            } else {
                long ns = timer.endNs - timer.startNs;
                double ms = ns / 1e6;
                System.out.printf("restore range: offsets %d..%d of %s%n", timer.startOffset, timer.endOffset,
                        timer.partition);
                System.out.printf("kafka-streams restored %d records in %.0f ms (%.0f records/s)%n",
                        timer.total, ms, timer.total / (ns / 1e9));
            }
        } finally {
            closeAndClean(streams, stateDir);
        }
        if (opts.containsKey("delete-topics")) {
            deleteTopicsAndGroup(bootstrap, app, List.of(input, changelog));
        }
        return rc;
    }

    /** Times the restore of the (one) changelog partition. */
    private static final class RestoreTimer implements StateRestoreListener {
        final CountDownLatch done = new CountDownLatch(1);
        volatile long startNs;
        volatile long endNs;
        volatile long total;
        volatile long startOffset;
        volatile long endOffset;
        volatile TopicPartition partition;

        @Override
        public void onRestoreStart(TopicPartition tp, String storeName, long startingOffset, long endingOffset) {
            startNs = System.nanoTime();
            partition = tp;
            startOffset = startingOffset;
            endOffset = endingOffset;
        }

        @Override
        public void onBatchRestored(TopicPartition tp, String storeName, long batchEndOffset, long numRestored) {}

        @Override
        public void onRestoreEnd(TopicPartition tp, String storeName, long totalRestored) {
            endNs = System.nanoTime();
            total = totalRestored;
            done.countDown();
        }
    }

    // ------------------------------------------------------------------ puts

    private static int puts(Map<String, String> opts) throws Exception {
        String bootstrap = bootstrap(opts);
        long rows = number(opts, "rows", 1_000_000);
        int valueSize = (int) number(opts, "value-size", 100);
        long seed = number(opts, "seed", 543);
        String app = opts.getOrDefault("application-id", "kstate-ks-puts-" + ProcessHandle.current().pid() + "-"
                + System.currentTimeMillis() / 1000);
        String store = opts.getOrDefault("store", "store");
        String topology = opts.getOrDefault("topology", "papi");
        String input = app + "-input";
        String changelog = app + "-" + store + "-changelog";
        if (rows <= 0 || rows > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("--rows must be in 1.." + Integer.MAX_VALUE);
        }

        // Not timed: a fresh input topic with the rows in a shuffled order.
        try (Admin admin = admin(bootstrap)) {
            if (admin.listTopics().names().get().contains(input)) {
                System.err.println("input topic " + input + " already exists: use a fresh --application-id");
                return 1;
            }
            createIfMissing(admin, input);
        }
        long produceStart = System.nanoTime();
        produce(bootstrap, input, (int) rows, valueSize, seed);
        System.out.printf("produced %d input records to %s in %.0f ms (not timed)%n", rows, input,
                (System.nanoTime() - produceStart) / 1e6);

        Path stateDir = Files.createTempDirectory("kstate-ks-puts-");
        PutCounter counter = new PutCounter(rows);
        KafkaStreams streams = new KafkaStreams(topology(topology, input, store, counter),
                streamsProps(bootstrap, app, stateDir));
        AtomicReference<Throwable> failure = watch(streams);
        int rc = 0;
        try (Admin admin = admin(bootstrap)) {
            long startNs = System.nanoTime();
            streams.start();
            if (!await(counter.done, failure, streams)) {
                System.err.println("kafka-streams: not all rows were processed (" + counter.count.get() + " of "
                        + rows + "): " + (failure.get() != null ? failure.get() : "state " + streams.state()));
                rc = 1;
            } else {
                // Every put is in the changelog once the topic's end offset reaches `rows` (the
                // producer is idempotent; the broker has acknowledged them all).
                long ackedNs = 0;
                long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(5);
                while (System.nanoTime() < deadline) {
                    if (endOffset(admin, changelog) >= rows) {
                        ackedNs = System.nanoTime();
                        break;
                    }
                    Thread.sleep(5);
                }
                double firstToLastMs = (counter.lastNs - counter.firstNs) / 1e6;
                double fromStartMs = (counter.lastNs - startNs) / 1e6;
                System.out.printf("kafka-streams puts startup: %.0f ms from KafkaStreams#start to the first put%n",
                        (counter.firstNs - startNs) / 1e6);
                System.out.printf("kafka-streams puts from-start rows=%d ms=%.0f rows_per_sec=%.0f%n", rows,
                        fromStartMs, rows / (fromStartMs / 1e3));
                if (ackedNs != 0) {
                    double ackedMs = (ackedNs - counter.firstNs) / 1e6;
                    System.out.printf("kafka-streams puts changelog-acked rows=%d ms=%.0f rows_per_sec=%.0f"
                            + " (first put to changelog end offset >= rows)%n", rows, ackedMs, rows / (ackedMs / 1e3));
                } else {
                    System.out.println("kafka-streams puts changelog-acked: the changelog end offset did not reach "
                            + rows + " within 5 minutes");
                }
                // The headline: first put to last put, like kstate's clock (write calls only).
                System.out.printf("kafka-streams puts rows=%d ms=%.0f rows_per_sec=%.0f%n", rows, firstToLastMs,
                        rows / (firstToLastMs / 1e3));
            }
        } finally {
            closeAndClean(streams, stateDir);
        }
        if (opts.containsKey("delete-topics")) {
            deleteTopicsAndGroup(bootstrap, app, List.of(input, changelog));
        }
        return rc;
    }

    /**
     * The end-to-end topology of compare.sh's e2e lines: {@code groupByKey().count()} of the input
     * to the output (count as decimal ASCII), caching off or on, commit.interval.ms=100 (kstate's
     * default commit interval). Runs until the input's {@code rows} records have been read, then
     * closes (flushing the cache and committing). The rate is measured from the output topic's
     * append times by kstate's e2e example, the same way for both systems.
     *
     * <p>{@code --guarantee exactly-once} sets processing.guarantee=exactly_once_v2 (default
     * at-least-once: at_least_once); nothing else changes (commit.interval.ms stays 100, which is
     * also Kafka Streams' default under exactly-once). A task whose transaction aborts processes its
     * records again, so the count of records read can reach {@code rows} before every record has
     * been processed in a committed transaction: under exactly-once the app also waits until the
     * group's committed offsets reach the input's end offsets before it closes.
     *
     * <p>{@code --topology windowed} counts per key in tumbling 1-minute windows with a 10 s grace
     * instead (see {@link #windowedTopology}), by the records' timestamps: the input of
     * {@code e2e setup --event-time-step-ms}. {@code --emit updates} (the default) sends every
     * window's count as it changes, {@code --emit final} only each window's final count, once,
     * when stream time passes its end plus the grace (KIP-825's emit strategy).
     */
    private static int e2e(Map<String, String> opts) throws Exception {
        String bootstrap = bootstrap(opts);
        String app = required(opts, "application-id");
        String input = required(opts, "input");
        String output = required(opts, "output");
        long rows = number(opts, "rows", 0);
        boolean caching = opts.getOrDefault("caching", "off").equals("on");
        String guarantee = guarantee(opts);
        boolean exactlyOnce = guarantee.equals(StreamsConfig.EXACTLY_ONCE_V2);
        String shape = opts.getOrDefault("topology", "count");
        boolean emitFinal = switch (opts.getOrDefault("emit", "updates")) {
            case "updates" -> false;
            case "final" -> true;
            default -> throw new IllegalArgumentException("--emit must be updates or final, not " + opts.get("emit"));
        };
        if (emitFinal && !shape.equals("windowed")) {
            throw new IllegalArgumentException("--emit final needs --topology windowed");
        }
        Path stateDir = Files.createTempDirectory("kstate-ks-e2e-");
        AtomicLong seen = new AtomicLong();
        CountDownLatch done = new CountDownLatch(1);
        Runnable onRecord = () -> {
            if (seen.incrementAndGet() == rows) {
                done.countDown();
            }
        };
        Topology topology = switch (shape) {
            case "count" -> countTopology(input, output, caching, onRecord);
            case "windowed" -> windowedTopology(input, output, caching, emitFinal, onRecord);
            default -> throw new IllegalArgumentException("--topology must be count or windowed, not " + shape);
        };
        Properties props = streamsProps(bootstrap, app, stateDir);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, caching ? 10L * 1024 * 1024 : 0L);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        KafkaStreams streams = new KafkaStreams(topology, props);
        AtomicReference<Throwable> failure = watch(streams);
        int rc = 0;
        try {
            long start = System.nanoTime();
            streams.start();
            if (!await(done, failure, streams)) {
                System.err.println("kafka-streams e2e: read " + seen.get() + " of " + rows + " records: "
                        + (failure.get() != null ? failure.get() : "state " + streams.state()));
                rc = 1;
            } else if (exactlyOnce && !committedToEnd(bootstrap, app, input, failure, streams)) {
                System.err.println("kafka-streams e2e: the group's committed offsets did not reach the end of "
                        + input + ": " + (failure.get() != null ? failure.get() : "state " + streams.state()));
                rc = 1;
            } else {
                System.out.printf("kafka-streams e2e read %d records in %.0f ms from start (%s%s, caching %s, %s)%n",
                        rows, (System.nanoTime() - start) / 1e6, shape, emitFinal ? " emit final" : "",
                        caching ? "on" : "off", guarantee);
            }
        } finally {
            closeAndClean(streams, stateDir);
        }
        return rc;
    }

    /**
     * {@code --guarantee at-least-once|exactly-once} (default at-least-once) as Kafka Streams'
     * processing.guarantee: at_least_once or exactly_once_v2.
     */
    private static String guarantee(Map<String, String> opts) {
        return switch (opts.getOrDefault("guarantee", "at-least-once")) {
            case "at-least-once" -> StreamsConfig.AT_LEAST_ONCE;
            case "exactly-once" -> StreamsConfig.EXACTLY_ONCE_V2;
            default -> throw new IllegalArgumentException(
                    "--guarantee must be at-least-once or exactly-once, not " + opts.get("guarantee"));
        };
    }

    /**
     * Waits until group {@code app}'s committed offsets equal {@code input}'s end offsets on every
     * partition (under exactly-once: every input record was processed in a committed transaction);
     * false if the client failed or stopped first, or {@link #WAIT_MINUTES} passed.
     */
    private static boolean committedToEnd(String bootstrap, String app, String input,
            AtomicReference<Throwable> failure, KafkaStreams streams) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(WAIT_MINUTES);
        try (Admin admin = admin(bootstrap)) {
            TopicDescription d = admin.describeTopics(List.of(input)).allTopicNames().get().get(input);
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            for (var p : d.partitions()) {
                latest.put(new TopicPartition(input, p.partition()), OffsetSpec.latest());
            }
            Map<TopicPartition, Long> ends = new HashMap<>();
            admin.listOffsets(latest).all().get().forEach((tp, info) -> ends.put(tp, info.offset()));
            while (System.nanoTime() < deadline) {
                var committed = admin.listConsumerGroupOffsets(app).partitionsToOffsetAndMetadata().get();
                boolean all = ends.entrySet().stream().allMatch(e -> {
                    var c = committed.get(e.getKey());
                    return e.getValue() == 0 || (c != null && c.offset() >= e.getValue());
                });
                if (all) {
                    return true;
                }
                KafkaStreams.State s = streams.state();
                if (failure.get() != null || s == KafkaStreams.State.ERROR || s == KafkaStreams.State.NOT_RUNNING
                        || s == KafkaStreams.State.PENDING_ERROR) {
                    return false;
                }
                Thread.sleep(20);
            }
        }
        return false;
    }

    /**
     * {@code groupByKey().count()} of the input to the output, the count as decimal ASCII; the
     * store is "counts" (changelog APP-counts-changelog), caching on or off; {@code onRecord} runs
     * for every input record.
     */
    private static Topology countTopology(String input, String output, boolean caching, Runnable onRecord) {
        Materialized<byte[], Long, KeyValueStore<org.apache.kafka.common.utils.Bytes, byte[]>> counts =
                Materialized.<byte[], Long, KeyValueStore<org.apache.kafka.common.utils.Bytes, byte[]>>as("counts")
                        .withKeySerde(Serdes.ByteArray())
                        .withValueSerde(Serdes.Long());
        counts = caching ? counts.withCachingEnabled() : counts.withCachingDisabled();
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .peek((k, v) -> onRecord.run())
                .groupByKey(org.apache.kafka.streams.kstream.Grouped.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .count(counts)
                .toStream()
                .mapValues(c -> Long.toString(c).getBytes(java.nio.charset.StandardCharsets.US_ASCII))
                .to(output, org.apache.kafka.streams.kstream.Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        return builder.build();
    }

    /** Kafka Streams' window of the windowed e2e: tumbling, 1 minute, grace 10 s. */
    static final TimeWindows E2E_WINDOWS = TimeWindows.ofSizeAndGrace(Duration.ofMinutes(1), Duration.ofSeconds(10));

    /**
     * The emit-final store's retention. At the default (size + grace, 70 s) Kafka Streams 4.1.1
     * lost most final counts of this input: it sends closed windows at most once a second per
     * task (its emit interval), and at this input's pace (a minute of event time every 50,000
     * records, well under a second) a window's segment is dropped, about 110 s of event time
     * after the window closed, before the next send looks for it. Ten minutes keeps every
     * window until long after it was sent; the store holds a few hundred thousand small counts.
     */
    static final Duration E2E_FINAL_RETENTION = Duration.ofMinutes(10);

    /**
     * {@code groupByKey().windowedBy(E2E_WINDOWS).count()} of the input to the output: key
     * {@code <key>@<window start ms>}, value the count as decimal ASCII, as kstate's windowed
     * count sends them. The store is "counts" (a RocksDB window store, retention size + grace,
     * changelog APP-counts-changelog), caching on or off. With {@code emitFinal} the count uses
     * {@code EmitStrategy.onWindowClose()}: Kafka Streams then keeps the counts in its
     * time-ordered window store (retention {@link #E2E_FINAL_RETENTION}) and, at most once a
     * second per task (its internal emit interval, default 1000 ms, left as shipped), sends every
     * window that closed since the last time. Windows that closed within the last second of a
     * task's processing are therefore not sent before the run stops; {@code e2e measure --expect
     * windows} accepts that (its clock then ends at the last output there is, which shortens this
     * side's clock). {@code onRecord} runs for every input record.
     */
    private static Topology windowedTopology(String input, String output, boolean caching, boolean emitFinal,
            Runnable onRecord) {
        Materialized<byte[], Long, WindowStore<Bytes, byte[]>> counts =
                Materialized.<byte[], Long, WindowStore<Bytes, byte[]>>as("counts")
                        .withKeySerde(Serdes.ByteArray())
                        .withValueSerde(Serdes.Long());
        counts = caching ? counts.withCachingEnabled() : counts.withCachingDisabled();
        if (emitFinal) {
            counts = counts.withRetention(E2E_FINAL_RETENTION);
        }
        StreamsBuilder builder = new StreamsBuilder();
        TimeWindowedKStream<byte[], byte[]> windowed = builder
                .stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .peek((k, v) -> onRecord.run())
                .groupByKey(Grouped.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .windowedBy(E2E_WINDOWS);
        if (emitFinal) {
            windowed = windowed.emitStrategy(EmitStrategy.onWindowClose());
        }
        windowed.count(counts)
                .toStream()
                .map((window, count) -> KeyValue.pair(windowKey(window), countText(count)))
                .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        return builder.build();
    }

    /** {@code <key>@<window start ms>}, the bytes kstate's windowed count sends. */
    private static byte[] windowKey(Windowed<byte[]> window) {
        byte[] start = ("@" + window.window().start()).getBytes(StandardCharsets.US_ASCII);
        return ByteBuffer.allocate(window.key().length + start.length).put(window.key()).put(start).array();
    }

    private static byte[] countText(Long count) {
        return Long.toString(count).getBytes(StandardCharsets.US_ASCII);
    }

    /**
     * The failover benchmark's copy (failover.sh): the e2e topology with caching off and
     * commit.interval.ms=100, state in {@code --state-dir} (kept), the consumer's
     * session.timeout.ms and heartbeat.interval.ms as given (the same values kstate's copies get),
     * running until killed or SIGTERM. Prints a line when a restore starts and ends, with the
     * wall-clock time in ms, so the failover's seconds can be split into detection and restore.
     *
     * <p>{@code --guarantee exactly-once} sets processing.guarantee=exactly_once_v2 (default
     * at-least-once). {@code --group-instance-id NAME} makes the copy a static member of the group
     * (group.instance.id, which Kafka Streams suffixes with "-THREAD" for each stream thread's
     * consumer: NAME-1 here): a copy restarted with the same name takes its old member's place and
     * partitions at once instead of waiting for the old session to expire. Under exactly_once_v2
     * the transactional id is APP-PROCESS_ID-THREAD, and the process id is kept in the state
     * dir, so a restart with the same --state-dir also fences its previous incarnation's producer.
     * {@code --standby-replicas N} sets num.standby.replicas (default 0).
     */
    private static int serve(Map<String, String> opts) throws Exception {
        String bootstrap = bootstrap(opts);
        String app = required(opts, "application-id");
        String input = required(opts, "input");
        String output = required(opts, "output");
        Path stateDir = Path.of(required(opts, "state-dir"));
        Files.createDirectories(stateDir);
        Topology topology = countTopology(input, output, false, () -> {});
        Properties props = streamsProps(bootstrap, app, stateDir);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
        props.put(StreamsConfig.consumerPrefix("session.timeout.ms"), (int) number(opts, "session-timeout-ms", 45000));
        props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), (int) number(opts, "heartbeat-interval-ms", 3000));
        String guarantee = guarantee(opts);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        String instance = opts.get("group-instance-id");
        if (instance != null) {
            props.put(StreamsConfig.mainConsumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG), instance);
        }
        props.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, (int) number(opts, "standby-replicas", 0));
        KafkaStreams streams = new KafkaStreams(topology, props);
        AtomicReference<Throwable> failure = watch(streams);
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
                System.err.printf("kafka-streams serve: restore %s/%d from %d to %d at_ms=%d%n", tp.topic(),
                        tp.partition(), start, end, System.currentTimeMillis());
            }

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long records) {}

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                System.err.printf("kafka-streams serve: restored %s/%d (%d records) at_ms=%d%n", tp.topic(),
                        tp.partition(), total, System.currentTimeMillis());
            }
        });
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(java.time.Duration.ofMinutes(1));
            stopped.countDown();
        }));
        streams.start();
        System.err.println("kafka-streams serve: " + app + " running (" + guarantee
                + (instance != null ? ", group.instance.id " + instance + "-THREAD" : "") + ")");
        while (!stopped.await(1, TimeUnit.SECONDS)) {
            if (failure.get() != null) {
                System.err.println("kafka-streams serve: failed: " + failure.get());
                return 1;
            }
        }
        return 0;
    }

    /** Counts the puts; records when the first and the last one happened. */
    private static final class PutCounter {
        final long target;
        final AtomicLong count = new AtomicLong();
        final CountDownLatch done = new CountDownLatch(1);
        volatile long firstNs;
        volatile long lastNs;

        PutCounter(long target) {
            this.target = target;
        }

        void onPut() {
            long n = count.incrementAndGet();
            if (n == 1) {
                firstNs = System.nanoTime();
            }
            if (n == target) {
                lastNs = System.nanoTime();
                done.countDown();
            }
        }
    }

    private static void produce(String bootstrap, String topic, int rows, int valueSize, long seed)
            throws Exception {
        Random rng = new Random(seed);
        long[] order = new long[rows];
        for (int i = 0; i < rows; i++) {
            order[i] = i;
        }
        for (int i = rows - 1; i > 0; i--) {
            int j = rng.nextInt(i + 1);
            long t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        byte[] pool = new byte[valueSize + 4096];
        rng.nextBytes(pool);

        Properties p = new Properties();
        p.putAll(CLIENT);
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, 20);
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, 1 << 20);
        p.put(ProducerConfig.BUFFER_MEMORY_CONFIG, 128L << 20);
        try (KafkaProducer<byte[], byte[]> producer =
                new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (int i = 0; i < rows; i++) {
                byte[] key = ByteBuffer.allocate(8).putLong(order[i]).array();
                int off = (int) ((i * 61L) % 4096);
                byte[] value = new byte[valueSize];
                System.arraycopy(pool, off, value, 0, valueSize);
                producer.send(new ProducerRecord<>(topic, 0, key, value));
            }
            producer.flush();
        }
        // A failed send surfaces only in its future; check that every record arrived instead.
        try (Admin admin = admin(bootstrap)) {
            long end = endOffset(admin, topic);
            if (end != rows) {
                throw new IllegalStateException("input topic " + topic + " has " + end + " records, wanted " + rows);
            }
        }
    }

    // ------------------------------------------------------------------ tasks

    /**
     * The Kafka Streams side of benches/kafka-streams/tasks.sh, the equivalent of kstate's
     * tasks_per_process (crates/kstate-bench/src/bin/tasks_per_process.rs): what many tasks cost
     * one process. A count-by-key topology (Processor API) with {@code --stores} S stores per
     * task, s0..s{S-1}
     * (Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore), ByteArray keys, Long counts,
     * logging on, caching off: kstate's StoreOptions::default has coalescing off), runs on a
     * fresh input of {@code --partitions} N partitions, so this one instance holds N tasks and
     * N * S RocksDB instances (one per store per task; kstate: one per task). Per record, for
     * every store: count = get(key) + 1, put(key, count); then (key, the last count as a decimal
     * string) to the N-partition output. {@code --records-per-partition} records per partition
     * (keys k0..k3 in turn, value "v") are produced first (not timed; the count is checked).
     *
     * <p>Settings: at_least_once, num.stream.threads {@code --threads} (2), no standby,
     * replication.factor -1 (the broker's default), state.dir a fresh temp dir, commit.interval.ms Kafka Streams' default
     * (30 s under at_least_once: the fresh start's processed_s waits for the first commit; kstate
     * commits every 100 ms; {@code --commit-interval-ms MS} sets it), everything else default.
     * The application id is fresh per run (tasks-N-PID-TIME-ks).
     *
     * <p>Started on the empty state dir ("fresh"), it prints the time from constructing the
     * KafkaStreams (clients and threads; the Topology is built before) until every task runs, and
     * until the group's committed input offsets sum to every record; then the process's
     * resources, then the close time. Then a second KafkaStreams on the same state dir and
     * application id ("restart"), the same lines but processed_s. "Every task runs": the client
     * is RUNNING, it has {@code --threads} stream threads, each RUNNING, and their active tasks
     * (metadataForLocalThreads) number N. With the state updater (on by default in 4.x) a stream
     * thread becomes RUNNING only once the state updater restores no active task and no task
     * waits to be initialized, i.e. every assigned active task has finished restoring and is
     * RUNNING; the thread metadata is taken at that transition, and any rebalance turns the client
     * REBALANCING again. The lines (the same as kstate's, with heap_mb and without budget_mb):
     *
     * <pre>
     * tasks-open n=N start=fresh running_s=S processed_s=S
     * tasks-open n=N start=restart running_s=S
     * tasks-resources n=N start=fresh|restart rss_mb=MB threads=N fds=N rocksdb=N memtable_mb=MB cache_mb=MB heap_mb=MB
     * tasks-close n=N start=fresh|restart close_s=S
     * </pre>
     *
     * <p>rss_mb and threads from /proc/self/status, fds the entries of /proc/self/fd, rocksdb the
     * directories under state.dir holding a CURRENT file, memtable_mb and cache_mb the sums of
     * the stores' RocksDB metrics size-all-mem-tables and block-cache-usage (each store has its
     * own block cache by default), heap_mb the JVM heap in use. On a failure (the client
     * failing, a start not done within {@code --deadline-s}, a close that times out) it prints
     * {@code tasks-failed n=N start=fresh|restart reason=REASON error=MESSAGE} (REASON:
     * too-many-open-files, out-of-memory, timeout, close-timeout, or the exception's class) and
     * exits 1. Either way the topics (input, output, changelogs), the consumer group and the state
     * dir are deleted at the end.
     */
    private static int tasks(Map<String, String> opts) throws Exception {
        String bootstrap = bootstrap(opts);
        long partitionsLong = number(opts, "partitions", 0);
        if (partitionsLong <= 0 || partitionsLong > 100_000) {
            throw new IllegalArgumentException("--partitions N (1..100000) is required");
        }
        int n = (int) partitionsLong;
        int stores = (int) number(opts, "stores", 3);
        long perPartition = number(opts, "records-per-partition", 10);
        int threads = (int) number(opts, "threads", 2);
        long deadlineS = number(opts, "deadline-s", 600);
        if (stores <= 0 || perPartition < 0 || threads <= 0 || deadlineS <= 0) {
            throw new IllegalArgumentException("--stores, --threads and --deadline-s must be positive,"
                    + " --records-per-partition not negative");
        }
        String app = String.format("tasks-%d-%d-%d-ks", n, ProcessHandle.current().pid(),
                System.currentTimeMillis() / 1000 % 1_000_000);
        String input = app + "-in";
        String output = app + "-out";
        List<String> topics = new ArrayList<>(List.of(input, output));
        for (int s = 0; s < stores; s++) {
            topics.add(app + "-s" + s + "-changelog");
        }
        Path stateDir = Files.createTempDirectory("kstate-ks-tasks-");
        TasksRun run = new TasksRun(bootstrap, app, input, output, n, stores, threads, stateDir,
                TimeUnit.SECONDS.toNanos(deadlineS));
        run.commitIntervalMs = number(opts, "commit-interval-ms", -1);
        int rc = 0;
        try (Admin admin = admin(bootstrap)) {
            if (admin.listTopics().names().get().contains(input)) {
                // Not ours: leave it (and the rest) alone.
                System.err.println("kafka-streams tasks: input topic " + input + " already exists");
                deleteTree(stateDir);
                return 1;
            }
        }
        try (Admin admin = admin(bootstrap)) {
            run.admin = admin;
            long setupStart = System.nanoTime();
            admin.createTopics(List.of(new NewTopic(input, n, (short) 1), new NewTopic(output, n, (short) 1)))
                    .all().get(5, TimeUnit.MINUTES);
            produceTasksInput(bootstrap, admin, input, n, perPartition);
            System.err.printf("kafka-streams tasks: %d partitions, %d records each, in %.0f ms%n", n, perPartition,
                    (System.nanoTime() - setupStart) / 1e6);
            long rows = perPartition * n;
            if (!run.start("fresh", rows) || !run.start("restart", -1)) {
                rc = 1;
            }
        } catch (Throwable e) {
            // Setup failed (or something outside a start): still clean up.
            System.out.printf("tasks-failed n=%d start=setup reason=%s error=%s%n", n, reason(e), oneLine(e));
            e.printStackTrace();
            rc = 1;
        } finally {
            deleteTopicsAndGroup(bootstrap, app, topics);
            try {
                deleteTree(stateDir);
            } catch (IOException e) {
                System.err.println("could not remove " + stateDir + ": " + e);
            }
        }
        return rc;
    }

    /** One tasks run: its names and settings, and the starts on one state dir. */
    private static final class TasksRun {
        final String bootstrap;
        final String app;
        final String input;
        final String output;
        final int n;
        final int stores;
        final int threads;
        final Path stateDir;
        final long deadlineNs;
        /** --commit-interval-ms, or -1: Kafka Streams' default. */
        long commitIntervalMs = -1;
        Admin admin;

        TasksRun(String bootstrap, String app, String input, String output, int n, int stores, int threads,
                Path stateDir, long deadlineNs) {
            this.bootstrap = bootstrap;
            this.app = app;
            this.input = input;
            this.output = output;
            this.n = n;
            this.stores = stores;
            this.threads = threads;
            this.stateDir = stateDir;
            this.deadlineNs = deadlineNs;
        }

        /**
         * Starts a KafkaStreams, waits until every task runs (and, given {@code rows} >= 0, until
         * the group committed that many input records), prints what it measured, closes it.
         * False (after a tasks-failed line) if any of it failed.
         */
        boolean start(String name, long rows) {
            Topology topology = tasksTopology(input, output, stores);
            Properties props = streamsProps(bootstrap, app, stateDir);
            props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
            props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
            if (commitIntervalMs >= 0) {
                props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitIntervalMs);
            }
            KafkaStreams streams = null;
            AtomicReference<Throwable> failure = new AtomicReference<>();
            String failed = null;
            String error = null;
            long started = System.nanoTime();
            try {
                streams = new KafkaStreams(topology, props);
                KafkaStreams s = streams;
                streams.setUncaughtExceptionHandler(e -> {
                    failure.compareAndSet(null, e);
                    return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
                });
                streams.start();
                double running = until(s, failure, started, () -> allRunning(s)) / 1e9;
                String line = String.format("tasks-open n=%d start=%s running_s=%.2f", n, name, running);
                if (rows >= 0) {
                    double processed = until(s, failure, started, () -> committedTotal() >= rows) / 1e9;
                    line += String.format(" processed_s=%.2f", processed);
                }
                System.out.println(line);
                System.out.println(resources(name, streams));
            } catch (Throwable e) {
                Throwable cause = failure.get() != null ? failure.get() : e;
                failed = e instanceof DeadlineException ? "timeout" : reason(cause);
                error = oneLine(cause);
                cause.printStackTrace();
            }
            if (streams != null) {
                long stopping = System.nanoTime();
                boolean closed;
                try {
                    closed = streams.close(new KafkaStreams.CloseOptions().leaveGroup(true)
                            .timeout(java.time.Duration.ofMinutes(5)));
                } catch (Throwable e) {
                    closed = false;
                    if (failed == null) {
                        failed = reason(e);
                        error = "close: " + oneLine(e);
                    }
                }
                if (closed) {
                    System.out.printf("tasks-close n=%d start=%s close_s=%.2f%n", n, name,
                            (System.nanoTime() - stopping) / 1e9);
                } else if (failed == null) {
                    failed = "close-timeout";
                    error = "KafkaStreams#close did not finish within 5 minutes (state " + streams.state() + ")";
                }
                if (failed == null && failure.get() != null) {
                    failed = reason(failure.get());
                    error = oneLine(failure.get());
                }
            }
            if (failed != null) {
                System.out.printf("tasks-failed n=%d start=%s reason=%s error=%s%n", n, name, failed, error);
                return false;
            }
            return true;
        }

        /** Every task running: see {@link #tasks}. */
        boolean allRunning(KafkaStreams streams) {
            if (streams.state() != KafkaStreams.State.RUNNING) {
                return false;
            }
            var metadata = streams.metadataForLocalThreads();
            if (metadata.size() != threads) {
                return false;
            }
            int active = 0;
            for (var thread : metadata) {
                if (!thread.threadState().equals("RUNNING")) {
                    return false;
                }
                active += thread.activeTasks().size();
            }
            return active == n && streams.state() == KafkaStreams.State.RUNNING;
        }

        /** The sum of the group's committed offsets on the input (every partition starts at 0). */
        long committedTotal() {
            try {
                var committed = admin.listConsumerGroupOffsets(app).partitionsToOffsetAndMetadata()
                        .get(10, TimeUnit.SECONDS);
                long total = 0;
                for (var e : committed.entrySet()) {
                    if (e.getKey().topic().equals(input) && e.getValue() != null) {
                        total += e.getValue().offset();
                    }
                }
                return total;
            } catch (Exception e) {
                return -1;
            }
        }

        /** The nanoseconds from the start until {@code done}; throws if the client fails or time runs out. */
        long until(KafkaStreams streams, AtomicReference<Throwable> failure, long started,
                java.util.function.BooleanSupplier done) throws Exception {
            long deadline = started + deadlineNs;
            while (true) {
                if (done.getAsBoolean()) {
                    return System.nanoTime() - started;
                }
                KafkaStreams.State s = streams.state();
                if (failure.get() != null) {
                    throw new IllegalStateException("Kafka Streams failed", failure.get());
                }
                if (s == KafkaStreams.State.ERROR || s == KafkaStreams.State.PENDING_ERROR
                        || s == KafkaStreams.State.NOT_RUNNING || s == KafkaStreams.State.PENDING_SHUTDOWN) {
                    throw new IllegalStateException("Kafka Streams is " + s);
                }
                if (System.nanoTime() >= deadline) {
                    throw new DeadlineException("not done within " + deadlineNs / 1_000_000_000L + " s (state " + s
                            + ", active tasks " + activeTasks(streams) + " of " + n + ")");
                }
                Thread.sleep(5);
            }
        }

        String resources(String name, KafkaStreams streams) throws IOException {
            double memtable = 0;
            double cache = 0;
            for (var e : streams.metrics().entrySet()) {
                if (!e.getKey().group().equals("stream-state-metrics")) {
                    continue;
                }
                String metric = e.getKey().name();
                if (metric.equals("size-all-mem-tables") || metric.equals("block-cache-usage")) {
                    Object v = e.getValue().metricValue();
                    double bytes = v instanceof Number num ? num.doubleValue() : 0;
                    if (metric.equals("size-all-mem-tables")) {
                        memtable += bytes;
                    } else {
                        cache += bytes;
                    }
                }
            }
            Runtime rt = Runtime.getRuntime();
            double mb = 1 << 20;
            long fds;
            try (var list = Files.list(Path.of("/proc/self/fd"))) {
                fds = list.count();
            }
            return String.format("tasks-resources n=%d start=%s rss_mb=%.0f threads=%d fds=%d rocksdb=%d"
                            + " memtable_mb=%.0f cache_mb=%.0f heap_mb=%.0f",
                    n, name, procStatus("VmRSS") * 1024 / mb, procStatus("Threads"), fds, rocksdbInstances(stateDir),
                    memtable / mb, cache / mb, (rt.totalMemory() - rt.freeMemory()) / mb);
        }
    }

    private static int activeTasks(KafkaStreams streams) {
        return streams.metadataForLocalThreads().stream().mapToInt(t -> t.activeTasks().size()).sum();
    }

    /** A start that did not finish within --deadline-s. */
    private static final class DeadlineException extends Exception {
        DeadlineException(String message) {
            super(message);
        }
    }

    /** A short name for how Kafka Streams failed, from the cause chain. */
    private static String reason(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            String m = String.valueOf(t.getMessage());
            if (m.contains("Too many open files")) {
                return "too-many-open-files";
            }
            if (t instanceof OutOfMemoryError) {
                return "out-of-memory";
            }
            if (t instanceof java.util.concurrent.TimeoutException
                    || t instanceof org.apache.kafka.common.errors.TimeoutException) {
                return "timeout";
            }
        }
        Throwable root = e;
        while (root.getCause() != null && root.getCause() != root) {
            root = root.getCause();
        }
        return root.getClass().getSimpleName();
    }

    /** The exception and its causes on one line. */
    private static String oneLine(Throwable e) {
        StringBuilder b = new StringBuilder();
        for (Throwable t = e; t != null && b.length() < 600; t = t.getCause()) {
            if (b.length() > 0) {
                b.append(" <- ");
            }
            b.append(t.getClass().getSimpleName()).append(": ").append(t.getMessage());
            if (t.getCause() == t) {
                break;
            }
        }
        return b.toString().replace('\n', ' ');
    }

    /** The input: {@code perPartition} records (keys k0..k3 in turn, value "v") in every partition; checked. */
    private static void produceTasksInput(String bootstrap, Admin admin, String topic, int partitions,
            long perPartition) throws Exception {
        Properties p = new Properties();
        p.putAll(CLIENT);
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        byte[] value = "v".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
        // Every send is checked: a record the producer gave up on names its partition and why,
        // instead of surfacing later as a short count.
        List<java.util.concurrent.Future<org.apache.kafka.clients.producer.RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer =
                new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (int partition = 0; partition < partitions; partition++) {
                for (long i = 0; i < perPartition; i++) {
                    byte[] key = ("k" + (i % 4)).getBytes(java.nio.charset.StandardCharsets.US_ASCII);
                    sent.add(producer.send(new ProducerRecord<>(topic, partition, key, value)));
                }
            }
            producer.flush();
        }
        for (var future : sent) {
            future.get();
        }
        Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
        for (int partition = 0; partition < partitions; partition++) {
            latest.put(new TopicPartition(topic, partition), OffsetSpec.latest());
        }
        long total = 0;
        for (var info : admin.listOffsets(latest).all().get(2, TimeUnit.MINUTES).values()) {
            total += info.offset();
        }
        if (total != perPartition * partitions) {
            throw new IllegalStateException("input topic " + topic + " has " + total + " records, wanted "
                    + perPartition * partitions);
        }
    }

    /** Source on the input, the counting processor with its stores, sink on the output. */
    private static Topology tasksTopology(String input, String output, int stores) {
        Topology topology = new Topology();
        topology.addSource("input", Serdes.ByteArray().deserializer(), Serdes.ByteArray().deserializer(), input);
        List<String> names = new ArrayList<>();
        for (int s = 0; s < stores; s++) {
            names.add("s" + s);
        }
        topology.addProcessor("count-in-every", () -> new CountInEvery(names), "input");
        for (String name : names) {
            topology.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(name),
                            Serdes.ByteArray(), Serdes.Long())
                    .withLoggingEnabled(Map.of())
                    .withCachingDisabled(), "count-in-every");
        }
        topology.addSink("output", output, Serdes.ByteArray().serializer(), Serdes.ByteArray().serializer(),
                "count-in-every");
        return topology;
    }

    /** Counts every record of its task in each of its stores; forwards the last count. */
    private static final class CountInEvery implements Processor<byte[], byte[], byte[], byte[]> {
        private final List<String> names;
        private final List<KeyValueStore<byte[], Long>> stores = new ArrayList<>();
        private ProcessorContext<byte[], byte[]> context;

        CountInEvery(List<String> names) {
            this.names = names;
        }

        @Override
        public void init(ProcessorContext<byte[], byte[]> context) {
            this.context = context;
            for (String name : names) {
                stores.add(context.getStateStore(name));
            }
        }

        @Override
        public void process(Record<byte[], byte[]> record) {
            byte[] key = record.key() == null ? new byte[0] : record.key();
            long count = 0;
            for (KeyValueStore<byte[], Long> store : stores) {
                Long old = store.get(key);
                count = (old == null ? 0 : old) + 1;
                store.put(key, count);
            }
            context.forward(record.withKey(key)
                    .withValue(Long.toString(count).getBytes(java.nio.charset.StandardCharsets.US_ASCII)));
        }
    }

    /** The first number of a /proc/self/status field (VmRSS in kB, Threads). */
    private static long procStatus(String field) throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (line.startsWith(field + ":")) {
                return Long.parseLong(line.substring(field.length() + 1).trim().split("\\s+")[0]);
            }
        }
        throw new IOException("no " + field + " in /proc/self/status");
    }

    /** Directories under {@code dir} that hold a RocksDB (a CURRENT file). */
    private static long rocksdbInstances(Path dir) throws IOException {
        try (var walk = Files.walk(dir)) {
            return walk.filter(p -> p.getFileName().toString().equals("CURRENT") && Files.isRegularFile(p)).count();
        }
    }

    // ------------------------------------------------------------------ shared

    /**
     * APP-input -> put into STORE. "papi": a processor that calls put (the plain
     * Stores.keyValueStoreBuilder store). "dsl": builder.table(input, Materialized.as(...)), whose
     * source processor also reads the old value before each put.
     */
    private static Topology topology(String kind, String input, String store, PutCounter counter) {
        StreamsBuilder builder = new StreamsBuilder();
        Consumed<byte[], byte[]> consumed = Consumed.with(Serdes.ByteArray(), Serdes.ByteArray());
        switch (kind) {
            case "dsl" -> {
                if (counter != null) {
                    throw new IllegalArgumentException("--topology dsl counts no puts; use papi for puts");
                }
                builder.table(input, consumed,
                        Materialized.<byte[], byte[]>as(Stores.persistentKeyValueStore(store))
                                .withKeySerde(Serdes.ByteArray())
                                .withValueSerde(Serdes.ByteArray())
                                .withLoggingEnabled(Map.of())
                                .withCachingDisabled());
            }
            case "papi" -> {
                builder.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(store),
                                Serdes.ByteArray(), Serdes.ByteArray())
                        .withLoggingEnabled(Map.of())
                        .withCachingDisabled());
                builder.stream(input, consumed).process(() -> new PutProcessor(store, counter), store);
            }
            default -> throw new IllegalArgumentException("--topology must be dsl or papi, not " + kind);
        }
        return builder.build();
    }

    private static final class PutProcessor implements Processor<byte[], byte[], Void, Void> {
        private final String storeName;
        private final PutCounter counter;
        private KeyValueStore<byte[], byte[]> kv;

        PutProcessor(String storeName, PutCounter counter) {
            this.storeName = storeName;
            this.counter = counter;
        }

        @Override
        public void init(ProcessorContext<Void, Void> context) {
            kv = context.getStateStore(storeName);
        }

        @Override
        public void process(Record<byte[], byte[]> record) {
            kv.put(record.key(), record.value());
            if (counter != null) {
                counter.onPut();
            }
        }
    }

    private static Properties streamsProps(String bootstrap, String app, Path stateDir) {
        Properties p = new Properties();
        // The security settings first: Kafka Streams hands unprefixed client settings to all its
        // clients (main, restore and global consumers, producer, admin).
        p.putAll(CLIENT);
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        p.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, 0);
        // The broker's default (-1), as kstate's changelogs take it: 1 on the single broker, 3 on
        // the three-node cluster.
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, -1);
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        // Streams keeps dynamic members in the group after close (it expects a restart); this one
        // is done, so let it leave and --delete-topics delete the group.
        p.put(StreamsConfig.mainConsumerPrefix("internal.leave.group.on.close"), true);
        return p;
    }

    /** Records the first fatal error and shuts the client down on it. */
    private static AtomicReference<Throwable> watch(KafkaStreams streams) {
        AtomicReference<Throwable> failure = new AtomicReference<>();
        streams.setUncaughtExceptionHandler(e -> {
            failure.compareAndSet(null, e);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        return failure;
    }

    /** Waits for the latch; false if the client failed or stopped first, or time ran out. */
    private static boolean await(CountDownLatch latch, AtomicReference<Throwable> failure, KafkaStreams streams)
            throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(WAIT_MINUTES);
        while (System.nanoTime() < deadline) {
            if (latch.await(2, TimeUnit.MILLISECONDS)) {
                return true;
            }
            KafkaStreams.State s = streams.state();
            if (failure.get() != null || s == KafkaStreams.State.ERROR || s == KafkaStreams.State.NOT_RUNNING
                    || s == KafkaStreams.State.PENDING_ERROR) {
                return latch.getCount() == 0;
            }
        }
        return false;
    }

    private static void closeAndClean(KafkaStreams streams, Path stateDir) {
        // Leave the group on close, so that --delete-topics can also delete it.
        streams.close(new KafkaStreams.CloseOptions().leaveGroup(true).timeout(java.time.Duration.ofMinutes(2)));
        try {
            deleteTree(stateDir);
        } catch (IOException e) {
            System.err.println("could not remove " + stateDir + ": " + e);
        }
    }

    private static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.putAll(CLIENT);
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return Admin.create(p);
    }

    private static void createIfMissing(Admin admin, String topic) throws Exception {
        try {
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
        } catch (ExecutionException e) {
            if (!(e.getCause() instanceof TopicExistsException)) {
                throw e;
            }
        }
    }

    private static long endOffset(Admin admin, String topic) throws Exception {
        TopicPartition tp = new TopicPartition(topic, 0);
        return admin.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp).get().offset();
    }

    private static void deleteTopicsAndGroup(String bootstrap, String app, List<String> topics) {
        try (Admin admin = admin(bootstrap)) {
            try {
                admin.deleteConsumerGroups(List.of(app)).all().get(30, TimeUnit.SECONDS);
            } catch (Exception e) {
                System.err.println("could not delete consumer group " + app + ": " + e);
            }
            List<String> existing = new ArrayList<>(topics);
            existing.retainAll(admin.listTopics().names().get(30, TimeUnit.SECONDS));
            admin.deleteTopics(existing).all().get(30, TimeUnit.SECONDS);
            System.out.println("deleted topics " + existing);
        } catch (Exception e) {
            System.err.println("could not delete topics " + topics + ": " + e);
        }
    }

    private static void deleteTree(Path root) throws IOException {
        if (!Files.exists(root)) {
            return;
        }
        Files.walkFileTree(root, new SimpleFileVisitor<>() {
            @Override
            public FileVisitResult visitFile(Path file, BasicFileAttributes attrs) throws IOException {
                Files.delete(file);
                return FileVisitResult.CONTINUE;
            }

            @Override
            public FileVisitResult postVisitDirectory(Path dir, IOException exc) throws IOException {
                Files.delete(dir);
                return FileVisitResult.CONTINUE;
            }
        });
    }
}
