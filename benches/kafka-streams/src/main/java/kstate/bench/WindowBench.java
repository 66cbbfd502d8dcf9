package kstate.bench;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileVisitResult;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.SimpleFileVisitor;
import java.nio.file.attribute.BasicFileAttributes;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Stream;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * The Kafka Streams side of kstate's window-store checks (benches/kafka-streams/window-compat.sh
 * and the fetch comparison with kstate-bench's window_ops; see README.md, "Window stores").
 *
 * <pre>
 * window-count --bootstrap B --application-id APP --input TOPIC --records N --out FILE
 *              [--retention-ms MS] [--caching on|off] [--restored-out FILE] [--threads 1]
 * window-fetch [--keys 1000] [--windows 1440] [--calls 100000] [--warmup 100000] [--seed 1]
 * </pre>
 *
 * <p>{@code window-count} is the application whose changelog kstate must restore to the same
 * counts: {@code groupByKey().windowedBy(TimeWindows.ofSizeAndGrace(1 min, 10 s)).count()} into
 * the window store "counts" (RocksDB, changelog APP-counts-changelog), run until it has processed N
 * input records. Its store is then dumped through interactive queries, partition by partition,
 * as sorted lines {@code key<TAB>window start<TAB>count}, and the application closed (which
 * flushes its cache into the changelog; the topic stays). {@code --retention-ms} sets the store's
 * retention ({@code Materialized.withRetention}; without it Kafka Streams' default, size + grace);
 * {@code --caching off} turns the store's cache off. With {@code --restored-out} a second
 * instance with an empty state directory then restores the store from the changelog, and its
 * dump goes there: the store Kafka Streams itself rebuilds from what kstate restores from.
 *
 * <p>Two things make the dump the store's content and nothing else. The records are counted by a
 * second child of the source added after the aggregation, so a record is counted only once the
 * aggregation has put it (a processor's children run in the order they were added). And the
 * interactive queries read the cache too: with caching on, windows past retention that are
 * still cached show up in them (CachingWindowStore.all() does not filter by retention, the
 * RocksDB segments do), which is why {@code --restored-out} exists.
 *
 * <p>{@code window-fetch} times {@code WindowStore.fetch(key, t, t + 1 h - 1)} (its bounds are
 * inclusive: 60 one-minute windows) on a RocksDB window store opened through TopologyTestDriver
 * (Stores.persistentWindowStore, retention 1 day, windows of 1 minute, no duplicates, logging and
 * caching off; the store is the real segmented RocksDB store in a temp dir, behind the metered
 * layer every application's fetch goes through). It fills KEYS keys {@code k0000..} times
 * WINDOWS one-minute windows starting at 0 (window by window, as a stream would; value: an 8-byte
 * big-endian count), runs WARMUP untimed fetches for the JIT, then CALLS timed ones at random
 * keys and random window-aligned t in [0, (WINDOWS - 60) min], each iterated to its end. Prints
 * {@code window-fetch kafka-streams p50=<us>us p99=<us>us entries=<n>} (n: entries read by the
 * timed calls) and, after a flush, {@code window-files kafka-streams segments=<n> files=<n>}:
 * the store's segment directories (one RocksDB each) and the files under them.
 */
public final class WindowBench {
    private static final String STORE = "counts";
    private static final Duration SIZE = Duration.ofMinutes(1);
    private static final Duration GRACE = Duration.ofSeconds(10);
    private static final long WAIT_MS = Duration.ofMinutes(10).toMillis();

    private WindowBench() {}

    public static void main(String[] argv) throws Exception {
        if (argv.length == 0 || argv[0].equals("--help") || argv[0].equals("-h")) {
            usage();
            System.exit(argv.length == 0 ? 2 : 0);
        }
        Map<String, String> opts = parse(argv);
        int rc;
        switch (argv[0]) {
            case "window-count" -> rc = windowCount(opts);
            case "window-fetch" -> rc = windowFetch(opts);
            default -> {
                usage();
                rc = 2;
            }
        }
        System.exit(rc);
    }

    private static void usage() {
        System.err.println("usage:\n"
                + "  window-count --bootstrap B --application-id APP --input TOPIC --records N --out FILE"
                + " [--retention-ms MS] [--caching on|off] [--restored-out FILE] [--threads 1]\n"
                + "  window-fetch [--keys 1000] [--windows 1440] [--calls 100000] [--warmup 100000] [--seed 1]");
    }

    private static Map<String, String> parse(String[] argv) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 1; i < argv.length; i++) {
            String flag = argv[i];
            if (!flag.startsWith("--") || i + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --flag value, got " + flag);
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

    private static long number(Map<String, String> opts, String name, long fallback) {
        String v = opts.get(name);
        return v == null ? fallback : Long.parseLong(v.replace("_", ""));
    }

    // ---------------------------------------------------------------------------------------
    // window-count

    private static int windowCount(Map<String, String> opts) throws Exception {
        String bootstrap = required(opts, "bootstrap");
        String app = required(opts, "application-id");
        String input = required(opts, "input");
        long records = number(opts, "records", -1);
        if (records <= 0) {
            throw new IllegalArgumentException("--records N (> 0) is required");
        }
        Path out = Path.of(required(opts, "out"));
        String caching = opts.getOrDefault("caching", "on");
        if (!caching.equals("on") && !caching.equals("off")) {
            throw new IllegalArgumentException("--caching is on or off, not " + caching);
        }
        Long retentionMs = opts.containsKey("retention-ms") ? number(opts, "retention-ms", 0) : null;
        int partitions = partitionCount(bootstrap, input);

        AtomicLong processed = new AtomicLong();
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, byte[]> in = builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()));
        Materialized<String, Long, WindowStore<Bytes, byte[]>> store =
                Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(STORE)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long());
        if (retentionMs != null) {
            store = store.withRetention(Duration.ofMillis(retentionMs));
        }
        if (caching.equals("off")) {
            store = store.withCachingDisabled();
        }
        in.groupByKey(Grouped.with(Serdes.String(), Serdes.ByteArray()))
                .windowedBy(TimeWindows.ofSizeAndGrace(SIZE, GRACE))
                .count(store);
        // Added after the aggregation, so it runs after it for each record (see the class doc).
        in.foreach((k, v) -> processed.incrementAndGet());
        Topology topology = builder.build();

        System.err.printf("kafka-streams window-count: %s, %d partitions, windows %s grace %s, retention %s,"
                        + " caching %s, until %d records%n",
                input, partitions, SIZE, GRACE,
                retentionMs == null ? "default (size + grace)" : retentionMs + " ms", caching, records);

        Path stateDir = Files.createTempDirectory("kstate-ks-window-");
        long started = System.nanoTime();
        long counted;
        long dropped;
        try (KafkaStreams streams = new KafkaStreams(topology, streamsConfig(bootstrap, app, stateDir, opts))) {
            streams.start();
            long deadline = System.currentTimeMillis() + WAIT_MS;
            while (processed.get() < records) {
                if (streams.state() == KafkaStreams.State.ERROR || streams.state() == KafkaStreams.State.NOT_RUNNING) {
                    throw new IllegalStateException("Kafka Streams stopped: " + streams.state());
                }
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("processed " + processed.get() + " of " + records);
                }
                Thread.sleep(20);
            }
            System.err.printf("kafka-streams window-count: processed %d records in %d ms%n",
                    processed.get(), (System.nanoTime() - started) / 1_000_000);
            counted = dump(streams, partitions, out);
            dropped = (long) metricSum(streams, "dropped-records-total");
            boolean clean = streams.close(Duration.ofMinutes(2));
            if (!clean) {
                throw new IllegalStateException("Kafka Streams did not close within 2 minutes");
            }
        } finally {
            deleteTree(stateDir);
        }
        System.err.printf("kafka-streams window-count: dumped to %s; counted %d records, dropped %d (late)%n",
                out, counted, dropped);

        String restoredOut = opts.get("restored-out");
        if (restoredOut != null) {
            Path restoredDir = Files.createTempDirectory("kstate-ks-window-restored-");
            long restoreStarted = System.nanoTime();
            try (KafkaStreams streams = new KafkaStreams(topology, streamsConfig(bootstrap, app, restoredDir, opts))) {
                streams.start();
                long restoredCount = dump(streams, partitions, Path.of(restoredOut));
                System.err.printf("kafka-streams window-count: restored from the changelog in %d ms, dumped to %s;"
                                + " counted %d records%n",
                        (System.nanoTime() - restoreStarted) / 1_000_000, restoredOut, restoredCount);
                streams.close(Duration.ofMinutes(2));
            } finally {
                deleteTree(restoredDir);
            }
        }
        return 0;
    }

    private static Properties streamsConfig(String bootstrap, String app, Path stateDir, Map<String, String> opts) {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, (int) number(opts, "threads", 1));
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // The restoring instance joins the group the first one just closed in, whose member
        // stays until its session times out (a dynamic member does not leave on close): the
        // broker's minimum, so that the new instance gets the partitions soon.
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6_000);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1_000);
        return props;
    }

    /**
     * Writes every (key, window start) and count of the store to {@code out}, sorted, reading each
     * partition's store once its task runs (retrying while it is not yet assigned or restoring).
     * Returns the sum of the counts.
     */
    private static long dump(KafkaStreams streams, int partitions, Path out) throws Exception {
        List<String[]> rows = new ArrayList<>();
        long sum = 0;
        for (int p = 0; p < partitions; p++) {
            long deadline = System.currentTimeMillis() + WAIT_MS;
            while (true) {
                List<String[]> partitionRows = new ArrayList<>();
                long partitionSum = 0;
                try {
                    ReadOnlyWindowStore<String, Long> store = streams.store(
                            StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.<String, Long>windowStore())
                                    .withPartition(p));
                    try (KeyValueIterator<Windowed<String>, Long> it = store.all()) {
                        while (it.hasNext()) {
                            KeyValue<Windowed<String>, Long> e = it.next();
                            partitionRows.add(new String[] {
                                e.key.key(), Long.toString(e.key.window().start()), Long.toString(e.value)
                            });
                            partitionSum += e.value;
                        }
                    }
                } catch (InvalidStateStoreException notYet) {
                    if (System.currentTimeMillis() > deadline) {
                        throw notYet;
                    }
                    if (streams.state() == KafkaStreams.State.ERROR) {
                        throw new IllegalStateException("Kafka Streams failed", notYet);
                    }
                    Thread.sleep(50);
                    continue;
                }
                rows.addAll(partitionRows);
                sum += partitionSum;
                break;
            }
        }
        rows.sort((a, b) -> {
            int c = a[0].compareTo(b[0]);
            return c != 0 ? c : Long.compare(Long.parseLong(a[1]), Long.parseLong(b[1]));
        });
        StringBuilder text = new StringBuilder();
        for (String[] r : rows) {
            text.append(r[0]).append('\t').append(r[1]).append('\t').append(r[2]).append('\n');
        }
        Files.writeString(out, text, StandardCharsets.UTF_8);
        return sum;
    }

    private static int partitionCount(String bootstrap, String topic) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(props)) {
            return admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions().size();
        }
    }

    /** The sum of every metric named {@code name} (one per task for task-level metrics). */
    private static double metricSum(KafkaStreams streams, String name) {
        double sum = 0;
        for (Map.Entry<MetricName, ? extends Metric> e : streams.metrics().entrySet()) {
            if (e.getKey().name().equals(name) && e.getKey().group().equals("stream-task-metrics")
                    && e.getValue().metricValue() instanceof Number n) {
                sum += n.doubleValue();
            }
        }
        return sum;
    }

    // ---------------------------------------------------------------------------------------
    // window-fetch

    private static final long MINUTE = 60_000;

    private static int windowFetch(Map<String, String> opts) throws Exception {
        int keys = (int) number(opts, "keys", 1000);
        int windows = (int) number(opts, "windows", 1440);
        int calls = (int) number(opts, "calls", 100_000);
        int warmup = (int) number(opts, "warmup", 100_000);
        long seed = number(opts, "seed", 1);
        int span = 60;
        if (windows < span) {
            throw new IllegalArgumentException("--windows must be at least " + span);
        }

        // A processor that never runs: the topology only exists to own the store.
        Topology topology = new Topology();
        topology.addSource("source", Serdes.ByteArray().deserializer(), Serdes.ByteArray().deserializer(), "unused");
        topology.addProcessor("owner", () -> new Processor<Object, Object, Object, Object>() {
            @Override
            public void process(Record<Object, Object> record) {}
        }, "source");
        topology.addStateStore(
                Stores.windowStoreBuilder(
                                Stores.persistentWindowStore("w", Duration.ofDays(1), SIZE, false),
                                Serdes.Bytes(),
                                Serdes.ByteArray())
                        .withLoggingDisabled()
                        .withCachingDisabled(),
                "owner");
        Path stateDir = Files.createTempDirectory("kstate-ks-window-fetch-");
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "window-fetch");
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "unused:9092");
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        try (TopologyTestDriver driver = new TopologyTestDriver(topology, props)) {
            WindowStore<Bytes, byte[]> store = driver.getWindowStore("w");
            Bytes[] names = new Bytes[keys];
            for (int k = 0; k < keys; k++) {
                names[k] = Bytes.wrap(String.format("k%04d", k).getBytes(StandardCharsets.US_ASCII));
            }
            long fillStarted = System.nanoTime();
            long count = 0;
            for (int w = 0; w < windows; w++) {
                for (int k = 0; k < keys; k++) {
                    store.put(names[k], longBytes(++count), w * MINUTE);
                }
            }
            store.flush();
            System.err.printf("kafka-streams window-fetch: filled %d keys x %d windows in %d ms%n",
                    keys, windows, (System.nanoTime() - fillStarted) / 1_000_000);

            Random random = new Random(seed);
            int starts = windows - span + 1;
            long sink = 0;
            for (int i = 0; i < warmup; i++) {
                sink += fetch(store, names[random.nextInt(keys)], random.nextInt(starts) * MINUTE, span);
            }
            long[] nanos = new long[calls];
            long entries = 0;
            for (int i = 0; i < calls; i++) {
                Bytes key = names[random.nextInt(keys)];
                long t = random.nextInt(starts) * MINUTE;
                long begin = System.nanoTime();
                int n = fetch(store, key, t, span);
                nanos[i] = System.nanoTime() - begin;
                entries += n;
            }
            if (entries != (long) calls * span || sink != (long) warmup * span) {
                throw new IllegalStateException("expected " + span + " windows per fetch, read " + entries
                        + " in " + calls + " fetches");
            }
            Arrays.sort(nanos);
            System.out.printf("window-fetch kafka-streams p50=%.1fus p99=%.1fus entries=%d%n",
                    percentile(nanos, 0.50) / 1_000.0, percentile(nanos, 0.99) / 1_000.0, entries);

            store.flush();
            Path storeDir = findStoreDir(stateDir, "w");
            long segments;
            try (Stream<Path> list = Files.list(storeDir)) {
                segments = list.filter(Files::isDirectory).filter(d -> d.getFileName().toString().startsWith("w."))
                        .count();
            }
            long files;
            try (Stream<Path> walk = Files.walk(storeDir)) {
                files = walk.filter(Files::isRegularFile).count();
            }
            System.out.printf("window-files kafka-streams segments=%d files=%d%n", segments, files);
            System.err.printf("kafka-streams window-fetch: store directory %s%n", storeDir);
        } finally {
            deleteTree(stateDir);
        }
        return 0;
    }

    /** Fetches {@code span} windows of {@code key} from {@code t}, reads them all, returns how many. */
    private static int fetch(WindowStore<Bytes, byte[]> store, Bytes key, long t, int span) {
        int n = 0;
        try (WindowStoreIterator<byte[]> it = store.fetch(key, t, t + span * MINUTE - 1)) {
            while (it.hasNext()) {
                KeyValue<Long, byte[]> e = it.next();
                if (e.value.length == 8) {
                    n++;
                }
            }
        }
        return n;
    }

    private static long percentile(long[] sorted, double q) {
        int i = (int) Math.ceil(q * sorted.length) - 1;
        return sorted[Math.max(0, Math.min(sorted.length - 1, i))];
    }

    private static byte[] longBytes(long v) {
        return java.nio.ByteBuffer.allocate(8).putLong(v).array();
    }

    /** The directory of the store named {@code name} under a state directory (APP/TASK/NAME). */
    private static Path findStoreDir(Path stateDir, String name) throws IOException {
        try (Stream<Path> walk = Files.walk(stateDir)) {
            return walk.filter(Files::isDirectory).filter(d -> d.getFileName().toString().equals(name))
                    .findFirst().orElseThrow(() -> new IOException("no store directory " + name + " under " + stateDir));
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
            public FileVisitResult postVisitDirectory(Path dir, IOException e) throws IOException {
                Files.delete(dir);
                return FileVisitResult.CONTINUE;
            }
        });
    }
}
