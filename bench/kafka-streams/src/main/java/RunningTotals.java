// Kafka Streams' side of bench/bench_kafka_streams.py (and bench/bench_compare.py through it): a running
// total of the JSON "amount" per key, or (--group-by <field>) per value of a string field of the JSON, optionally
// after a join with a table (--join-table <topic> --join-field <field>).
//
// Build with Maven (../../../../pom.xml: kafka-streams and slf4j-nop), then run:
//
//     java -cp "target/classes:<dependency class path>" RunningTotals <bootstrap> <source> <output> <application id> \
//         <processing guarantee> <commit interval ms> <expected messages> [<state dir> [<threads> [<cache bytes>]]] \
//         [--dump <file>] [--restore] [--leave-group] [--group-by <field>] [--join-table <topic> --join-field <field>]
//
// Topology: stream(source) -> groupByKey -> aggregate(running total, persistent RocksDB store "totals"
// with its changelog) -> toStream -> mapValues({"customer": key, "total": total}) -> to(output).
// With <output> "-" the last three steps are left out: the totals only go to the store (and its changelog).
// Without --group-by the input is never repartitioned (the key is kept), so the task count equals the
// source's partitions. With --group-by <field>, groupByKey becomes groupBy((key, value) -> the value's string
// <field>): Kafka Streams writes each record under its new key to its repartition topic
// "<application id>-totals-repartition" (as many partitions as the source) and a second sub-topology reads
// them back into the aggregation, so there are twice as many tasks, all on the same stream thread(s).
// With --join-table <topic> --join-field <field>, the stream is first joined (KStream.join, inner) with a KTable
// read by builder.table(<topic>) into the persistent RocksDB store "customers" (the topic must be compacted and
// co-partitioned with the source); the ValueJoiner puts the table value's string <field> into the order's JSON
// (`{..., "<field>": "<value>"}`), and the join's output goes on to groupBy/groupByKey as above (the join runs in
// the source's sub-topology). With a join the topology is built with topology.optimization=all, so the table's
// source topic is its changelog too (no "<application id>-customers-changelog"): Kafka Streams' fastest setting
// for a table read from a topic.
//
// Options (anywhere among the arguments):
//   --dump <file>  once the expected records have been aggregated, and before close(), the whole store is
//                  read through interactive queries (KafkaStreams.store, all()) and written to <file>, one
//                  "<key>\t<total>" line per key (written to <file>.partial, then renamed).
//   --restore      register a StateRestoreListener (KafkaStreams.setGlobalStateRestoreListener) and report
//                  the restore: meant for a run of an application id that already processed part of the
//                  source (its changelog "<application id>-totals-changelog" holds the store) whose local
//                  state directory was deleted; <expected messages> is then the number of new records.
//   --leave-group  close with CloseOptions LEAVE_GROUP (Kafka Streams' default is to stay in the group until
//                  the session times out, 45 s): a later run of the same application id then gets its
//                  partitions at once instead of waiting for this run's members to time out.
//   --group-by <field>  re-key each record by the string <field> of its JSON value (e.g. "region") before
//                  the aggregation, through the repartition topic (see Topology); the totals are per <field>.
//   --join-table <topic>  join the stream with the table of <topic> first (see Topology); needs --join-field.
//   --join-field <field>  the string field of the table's JSON value the join adds to each order.
//   --session-gap <ms>  total the amounts per key and session of activity instead (windowedBy(SessionWindows
//                  .ofInactivityGapAndGrace(<ms>, --session-grace)), aggregate with a merger, the session store
//                  "totals" kept --session-retention ms): --dump then writes "<key>\t<start>\t<end>\t<total>" lines.
//   --session-grace <ms>, --session-retention <ms>  (defaults: 0, and 2 hours).
//
// Measurement: the clock starts just before KafkaStreams.start() (so it includes the group join and
// partition assignment, like the Python engine's run_worker) and stops when the aggregator has been
// applied to the expected number of records (counted inside the aggregator, after it added the amount; with
// --group-by that is after both hops, the source's sub-topology and the repartition topic's).
// The app is then closed cleanly (which flushes the caches and, under exactly_once_v2, commits the open
// transaction); the seconds until close() returned are printed too. With --dump, the store is read between
// the two: first the app waits until the stream threads' "process-total" metrics (recorded once a batch of
// records went through the whole topology; one count per record and sub-topology, so twice the aggregator's
// with --group-by) reach the aggregator's count times the hops (plus, with --join-table, the table records that
// went through the table's source node rather than a restore: counted by its timestamp extractor), so the last
// aggregate is in the store, not only returned by the aggregator; the seconds that waiting and reading took are
// printed apart and subtracted from <seconds until closed>. Restore (--restore): records restored = the sum of
// onBatchRestored's counts; <seconds restoring> = from the first onRestoreStart to the last onRestoreEnd
// (-1 if nothing was restored); the other figures are seconds from the clock's start. Restoring and
// processing overlap: a task processes as soon as its own store is restored. Lines on stdout meant for
// parsing:
//
//     RESULT <guarantee> <messages> <seconds until counted> <seconds until closed> <seconds until RUNNING>
//     DUMP <keys written> <seconds waiting for the store and reading it>                        (--dump)
//     RESTORE <records restored> <seconds restoring> <seconds until the first record was aggregated> \
//         <seconds until all were aggregated> <seconds until the first restore started> \
//         <seconds until the last restore ended> <restores started> <restores ended> <restores suspended>
//
// Everything else goes to stderr.

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.TimestampExtractor;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.ReadOnlySessionStore;
import org.apache.kafka.streams.state.SessionStore;

public final class RunningTotals {
    private static final String AMOUNT_FIELD = "\"amount\":";
    private static final String STORE = "totals";
    private static final String TABLE_STORE = "customers";
    private static final String NO_OUTPUT = "-";
    private static final String USAGE =
        "usage: RunningTotals <bootstrap> <source> <output or -> <application id> <processing guarantee> "
            + "<commit interval ms> <expected messages> [<state dir> [<threads> [<cache bytes>]]] "
            + "[--dump <file>] [--restore] [--leave-group] [--group-by <field>] "
            + "[--join-table <topic> --join-field <field>] "
            + "[--session-gap <ms> [--session-grace <ms>] [--session-retention <ms>]]";
    /** How long the dump may wait for the store to be up to date and queryable (e.g. during a rebalance). */
    private static final Duration DUMP_DEADLINE = Duration.ofMinutes(2);

    private RunningTotals() {}

    /** The integer after "amount": in a compact JSON object (what orjson writes: no spaces). */
    static long amount(String json) {
        int at = json.indexOf(AMOUNT_FIELD);
        if (at < 0) {
            throw new IllegalArgumentException("no \"amount\" in " + json);
        }
        int i = at + AMOUNT_FIELD.length();
        while (json.charAt(i) == ' ') {
            i++;
        }
        boolean negative = json.charAt(i) == '-';
        if (negative) {
            i++;
        }
        long value = 0;
        for (; i < json.length(); i++) {
            char c = json.charAt(i);
            if (c < '0' || c > '9') {
                break;
            }
            value = value * 10 + (c - '0');
        }
        return negative ? -value : value;
    }

    /** The string value of `quotedField` ("\"<field>\":\"") in a compact JSON object, without escapes. */
    static String stringField(String json, String quotedField) {
        int at = json.indexOf(quotedField);
        if (at < 0) {
            throw new IllegalArgumentException("no " + quotedField + " in " + json);
        }
        int start = at + quotedField.length();
        int end = json.indexOf('"', start);
        if (end < 0) {
            throw new IllegalArgumentException("an unterminated string after " + quotedField + " in " + json);
        }
        return json.substring(start, end);
    }

    /** Notes when restores start and end (System.nanoTime(), 0 = not yet) and counts the records restored. */
    static final class RestoreClock implements StateRestoreListener {
        final AtomicLong firstStartedAt = new AtomicLong();
        final AtomicLong lastEndedAt = new AtomicLong();
        final AtomicLong batchRecords = new AtomicLong();
        final AtomicLong endRecords = new AtomicLong();
        final AtomicInteger started = new AtomicInteger();
        final AtomicInteger ended = new AtomicInteger();
        final AtomicInteger suspended = new AtomicInteger();

        @Override
        public void onRestoreStart(TopicPartition partition, String store, long startOffset, long endOffset) {
            firstStartedAt.compareAndSet(0, System.nanoTime());
            started.incrementAndGet();
        }

        @Override
        public void onBatchRestored(TopicPartition partition, String store, long batchEndOffset, long numRestored) {
            batchRecords.addAndGet(numRestored);
        }

        @Override
        public void onRestoreEnd(TopicPartition partition, String store, long totalRestored) {
            endRecords.addAndGet(totalRestored);
            ended.incrementAndGet();
            lastEndedAt.accumulateAndGet(System.nanoTime(), Math::max);
        }

        @Override
        public void onRestoreSuspended(TopicPartition partition, String store, long totalRestored) {
            // The task moved (a rebalance) before its restore ended; it restarts where its new owner picks it up.
            suspended.incrementAndGet();
        }
    }

    /** Seconds from `began` to `at` (System.nanoTime() values), or -1 when `at` is 0 (never happened). */
    static double secondsSince(long began, long at) {
        return at == 0 ? -1.0 : (at - began) / 1e9;
    }

    /** The records the stream threads have put through the whole topology (their "process-total" metrics). */
    static long processedPerMetrics(KafkaStreams streams) {
        double total = 0;
        for (Map.Entry<MetricName, ? extends Metric> entry : streams.metrics().entrySet()) {
            MetricName name = entry.getKey();
            if (name.group().equals("stream-thread-metrics") && name.name().equals("process-total")) {
                total += ((Number) entry.getValue().metricValue()).doubleValue();
            }
        }
        return Math.round(total);
    }

    /**
     * Waits until the stream threads have finished the records the aggregator has seen, in each of the `hops`
     * sub-topologies they went through, and the `others` records (a table's) they processed besides (so the last
     * aggregate was put into the store), then writes the whole
     * store to `path` through interactive queries, retrying while the store is not queryable (the instance not
     * RUNNING, or its tasks migrating). Returns the keys written.
     */
    static long dumpStore(
        KafkaStreams streams, AtomicLong aggregated, int hops, AtomicLong others, Path path, boolean sessions)
        throws IOException, InterruptedException {
        long deadline = System.nanoTime() + DUMP_DEADLINE.toNanos();
        while (processedPerMetrics(streams) < aggregated.get() * hops + others.get()) {
            if (System.nanoTime() - deadline > 0) {
                throw new IllegalStateException(
                    "the stream threads' process-total stayed at " + processedPerMetrics(streams)
                        + " below the aggregator's " + aggregated.get() + " times " + hops + " plus "
                        + others.get() + " table records for " + DUMP_DEADLINE);
            }
            Thread.sleep(10);
        }
        Path partial = path.resolveSibling(path.getFileName() + ".partial");
        while (true) {
            try {
                if (sessions) {
                    return dumpSessions(streams, partial, path);
                }
                ReadOnlyKeyValueStore<String, Long> store =
                    streams.store(StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.keyValueStore()));
                long keys = 0;
                try (KeyValueIterator<String, Long> all = store.all();
                     BufferedWriter out = Files.newBufferedWriter(partial)) {
                    while (all.hasNext()) {
                        KeyValue<String, Long> entry = all.next();
                        out.write(entry.key);
                        out.write('\t');
                        out.write(Long.toString(entry.value));
                        out.write('\n');
                        keys++;
                    }
                }
                Files.move(partial, path, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
                return keys;
            } catch (InvalidStateStoreException exception) {
                if (System.nanoTime() - deadline > 0) {
                    throw exception;
                }
                System.err.println("store not queryable yet (" + streams.state() + "), retrying: " + exception);
                Thread.sleep(100);
            }
        }
    }

    /**
     * Every session of the session store, as "<key>\t<start>\t<end>\t<total>" lines; returns how many. An
     * interactive query is not isolated from the stream thread's commits: one that flushes the record cache while
     * the store is iterated can show a session that the cache had already replaced (its end since grown). So the
     * store is read until two reads in a row agree.
     */
    static long dumpSessions(KafkaStreams streams, Path partial, Path path) throws IOException {
        List<String> lines = readSessions(streams);
        for (List<String> again = readSessions(streams); !again.equals(lines); again = readSessions(streams)) {
            lines = again;
        }
        try (BufferedWriter out = Files.newBufferedWriter(partial)) {
            for (String line : lines) {
                out.write(line);
            }
        }
        Files.move(partial, path, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        return lines.size();
    }

    static List<String> readSessions(KafkaStreams streams) {
        ReadOnlySessionStore<String, Long> store =
            streams.store(StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.sessionStore()));
        List<String> lines = new ArrayList<>();
        try (KeyValueIterator<Windowed<String>, Long> all = store.fetch(null, null)) {
            while (all.hasNext()) {
                KeyValue<Windowed<String>, Long> entry = all.next();
                lines.add(entry.key.key() + '\t' + entry.key.window().start() + '\t' + entry.key.window().end()
                    + '\t' + entry.value + '\n');
            }
        }
        return lines;
    }

    public static void main(String[] args) throws InterruptedException {
        List<String> positional = new ArrayList<>();
        String dump = null;
        boolean restore = false;
        boolean leaveGroup = false;
        String groupByField = null;
        String joinTable = null;
        String joinField = null;
        long sessionGapMs = 0;
        long sessionGraceMs = 0;
        long sessionRetentionMs = Duration.ofHours(2).toMillis();
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("--dump")) {
                if (i + 1 == args.length) {
                    System.err.println("--dump needs a file\n" + USAGE);
                    System.exit(2);
                }
                dump = args[++i];
            } else if (args[i].equals("--restore")) {
                restore = true;
            } else if (args[i].equals("--leave-group")) {
                leaveGroup = true;
            } else if (args[i].equals("--group-by")) {
                if (i + 1 == args.length) {
                    System.err.println("--group-by needs a field\n" + USAGE);
                    System.exit(2);
                }
                groupByField = args[++i];
            } else if (args[i].equals("--join-table") || args[i].equals("--join-field")) {
                if (i + 1 == args.length) {
                    System.err.println(args[i] + " needs a value\n" + USAGE);
                    System.exit(2);
                }
                if (args[i].equals("--join-table")) {
                    joinTable = args[++i];
                } else {
                    joinField = args[++i];
                }
            } else if (args[i].startsWith("--session-")) {
                if (i + 1 == args.length) {
                    System.err.println(args[i] + " needs a number of ms\n" + USAGE);
                    System.exit(2);
                }
                long ms = Long.parseLong(args[i + 1]);
                switch (args[i++]) {
                    case "--session-gap" -> sessionGapMs = ms;
                    case "--session-grace" -> sessionGraceMs = ms;
                    case "--session-retention" -> sessionRetentionMs = ms;
                    default -> {
                        System.err.println("unknown option " + args[i - 1] + "\n" + USAGE);
                        System.exit(2);
                    }
                }
            } else if (args[i].startsWith("--")) {
                System.err.println("unknown option " + args[i] + "\n" + USAGE);
                System.exit(2);
            } else {
                positional.add(args[i]);
            }
        }
        if (positional.size() < 7 || positional.size() > 10) {
            System.err.println(USAGE);
            System.exit(2);
        }
        String bootstrap = positional.get(0);
        String source = positional.get(1);
        String output = positional.get(2);
        String applicationId = positional.get(3);
        String guarantee = positional.get(4);
        long commitIntervalMs = Long.parseLong(positional.get(5));
        long expected = Long.parseLong(positional.get(6));
        String stateDir = positional.size() > 7 ? positional.get(7) : null;
        int threads = positional.size() > 8 ? Integer.parseInt(positional.get(8)) : 1;
        Long cacheBytes = positional.size() > 9 ? Long.valueOf(positional.get(9)) : null;
        Path dumpPath = dump == null ? null : Paths.get(dump);
        if (expected <= 0) {
            System.err.println("<expected messages> must be positive\n" + USAGE);
            System.exit(2);
        }
        if ((joinTable == null) != (joinField == null)) {
            System.err.println("--join-table and --join-field go together\n" + USAGE);
            System.exit(2);
        }

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitIntervalMs);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        if (stateDir != null) {
            props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        }
        if (cacheBytes != null) {
            props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, cacheBytes);
        }
        if (joinTable != null) {
            // The table's source topic doubles as its changelog (reuse.ktable.source.topics, part of "all").
            props.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
        }

        AtomicLong processed = new AtomicLong();
        CountDownLatch allProcessed = new CountDownLatch(1);
        AtomicLong firstAt = new AtomicLong();
        AtomicLong countedAt = new AtomicLong();

        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> orders = builder.stream(source, Consumed.with(Serdes.String(), Serdes.String()));
        AtomicLong tableRecords = new AtomicLong();
        if (joinTable != null) {
            // Counts the table records that go through its source node (not those restored), for dumpStore.
            TimestampExtractor counting = (ConsumerRecord<Object, Object> record, long partitionTime) -> {
                tableRecords.incrementAndGet();
                return record.timestamp();
            };
            KTable<String, String> customers = builder.table(
                joinTable,
                Consumed.with(Serdes.String(), Serdes.String()).withTimestampExtractor(counting),
                Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as(TABLE_STORE)
                    .withKeySerde(Serdes.String())
                    .withValueSerde(Serdes.String()));
            String quotedJoinField = "\"" + joinField + "\":\"";
            String added = ",\"" + joinField + "\":\"";
            orders = orders.join(
                customers,
                (order, customer) -> {
                    String value = stringField(customer, quotedJoinField);
                    int end = order.lastIndexOf('}');
                    return order.substring(0, end) + added + value + "\"}";
                },
                Joined.with(Serdes.String(), Serdes.String(), Serdes.String()));
        }
        String quotedField = groupByField == null ? null : "\"" + groupByField + "\":\"";
        KGroupedStream<String, String> grouped = quotedField == null
            ? orders.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
            : orders.groupBy(
                (key, value) -> stringField(value, quotedField), Grouped.with(Serdes.String(), Serdes.String()));
        int hops = quotedField == null ? 1 : 2;
        boolean sessions = sessionGapMs > 0;
        if (sessions) {
            grouped
                .windowedBy(SessionWindows.ofInactivityGapAndGrace(
                    Duration.ofMillis(sessionGapMs), Duration.ofMillis(sessionGraceMs)))
                .aggregate(
                    () -> 0L,
                    (key, value, total) -> {
                        long updated = total + amount(value);
                        long count = processed.incrementAndGet();
                        if (count == 1) {
                            firstAt.set(System.nanoTime());
                        }
                        if (count == expected) {
                            countedAt.set(System.nanoTime());
                            allProcessed.countDown();
                        }
                        return updated;
                    },
                    (key, earlier, later) -> earlier + later,
                    Materialized.<String, Long, SessionStore<Bytes, byte[]>>as(STORE)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long())
                        .withRetention(Duration.ofMillis(sessionRetentionMs)));
        }
        KTable<String, Long> totals = sessions ? null : grouped
            .aggregate(
                () -> 0L,
                (key, value, total) -> {
                    long updated = total + amount(value);
                    long count = processed.incrementAndGet();
                    if (count == 1) {
                        firstAt.set(System.nanoTime());
                    }
                    if (count == expected) {
                        countedAt.set(System.nanoTime());
                        allProcessed.countDown();
                    }
                    return updated;
                },
                Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(STORE)
                    .withKeySerde(Serdes.String())
                    .withValueSerde(Serdes.Long()));
        if (!output.equals(NO_OUTPUT) && totals != null) {
            totals.toStream()
                .mapValues((key, total) -> "{\"customer\":\"" + key + "\",\"total\":" + total + "}")
                .to(output, Produced.with(Serdes.String(), Serdes.String()));
        }

        KafkaStreams streams = new KafkaStreams(builder.build(props), props);
        AtomicLong runningAt = new AtomicLong();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        streams.setStateListener((newState, oldState) -> {
            if (newState == KafkaStreams.State.RUNNING && runningAt.get() == 0) {
                runningAt.set(System.nanoTime());
            }
        });
        streams.setUncaughtExceptionHandler(exception -> {
            failure.compareAndSet(null, exception);
            allProcessed.countDown();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                .SHUTDOWN_CLIENT;
        });
        RestoreClock restores = new RestoreClock();
        if (restore) {
            streams.setGlobalStateRestoreListener(restores);
        }

        long began = System.nanoTime();
        streams.start();
        boolean done = allProcessed.await(30, TimeUnit.MINUTES);
        long counted = countedAt.get();
        long dumpedKeys = -1;
        long dumpNanos = 0;
        Exception dumpFailure = null;
        if (dumpPath != null && done && counted != 0 && failure.get() == null) {
            long dumpBegan = System.nanoTime();
            try {
                dumpedKeys = dumpStore(streams, processed, hops, tableRecords, dumpPath, sessions);
            } catch (IOException | RuntimeException exception) {
                dumpFailure = exception;
            }
            dumpNanos = System.nanoTime() - dumpBegan;
        }
        boolean closed = leaveGroup
            ? streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
                .withTimeout(Duration.ofMinutes(2)))
            : streams.close(Duration.ofMinutes(2));
        long closedAt = System.nanoTime();
        streams.cleanUp();

        if (failure.get() != null) {
            System.err.println("FAILED: a stream thread died: " + failure.get());
            failure.get().printStackTrace();
            System.exit(1);
        }
        if (!done || counted == 0) {
            System.err.println("FAILED: processed " + processed.get() + " of " + expected + " records in 30 minutes");
            System.exit(1);
        }
        if (dumpFailure != null) {
            System.err.println("FAILED: dumping the store to " + dumpPath + ": " + dumpFailure);
            dumpFailure.printStackTrace();
            System.exit(1);
        }
        if (!closed) {
            System.err.println("FAILED: KafkaStreams.close did not finish within 2 minutes");
            System.exit(1);
        }
        if (processed.get() != expected) {
            // More than expected means records were processed twice (e.g. after a task migration).
            System.err.println("WARNING: the aggregator ran " + processed.get() + " times for " + expected + " records");
        }
        long running = runningAt.get();
        System.out.printf(
            "RESULT %s %d %.3f %.3f %.3f%n",
            guarantee,
            expected,
            (counted - began) / 1e9,
            (closedAt - began - dumpNanos) / 1e9,
            secondsSince(began, running));
        if (dumpPath != null) {
            System.out.printf("DUMP %d %.3f%n", dumpedKeys, dumpNanos / 1e9);
        }
        if (restore) {
            long firstStarted = restores.firstStartedAt.get();
            long lastEnded = restores.lastEndedAt.get();
            if (restores.started.get() == 0) {
                System.err.println("WARNING: --restore, but nothing was restored (a local state directory was left?)");
            } else if (restores.suspended.get() == 0 && restores.endRecords.get() != restores.batchRecords.get()) {
                System.err.println(
                    "WARNING: onRestoreEnd reported " + restores.endRecords.get() + " records restored, "
                        + "onBatchRestored " + restores.batchRecords.get());
            }
            System.out.printf(
                "RESTORE %d %.3f %.3f %.3f %.3f %.3f %d %d %d%n",
                restores.batchRecords.get(),
                firstStarted == 0 || lastEnded == 0 ? -1.0 : (lastEnded - firstStarted) / 1e9,
                secondsSince(began, firstAt.get()),
                (counted - began) / 1e9,
                secondsSince(began, firstStarted),
                secondsSince(began, lastEnded),
                restores.started.get(),
                restores.ended.get(),
                restores.suspended.get());
        }
    }
}
