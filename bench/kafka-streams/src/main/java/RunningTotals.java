// Kafka Streams' side of bench/bench_kafka_streams.py: a running total of the JSON "amount" per key.
//
// Build with Maven (../../../../pom.xml: kafka-streams and slf4j-nop), then run:
//
//     java -cp "target/classes:<dependency class path>" RunningTotals <bootstrap> <source> <output> <application id> \
//         <processing guarantee> <commit interval ms> <expected messages> [<state dir> [<threads> [<cache bytes>]]]
//
// Topology: stream(source) -> groupByKey -> aggregate(running total, persistent RocksDB store "totals"
// with its changelog) -> toStream -> mapValues({"customer": key, "total": total}) -> to(output).
// The input is never repartitioned (the key is kept), so the task count equals the source's partitions.
//
// Measurement: the clock starts just before KafkaStreams.start() (so it includes the group join and
// partition assignment, like the Python engine's run_worker) and stops when the aggregator has been
// applied to the expected number of records (counted inside the aggregator, after it added the amount).
// The app is then closed cleanly (which flushes the caches and, under exactly_once_v2, commits the open
// transaction); the seconds until close() returned are printed too. One line on stdout is meant for
// parsing:
//
//     RESULT <guarantee> <messages> <seconds until counted> <seconds until closed> <seconds until RUNNING>
//
// Everything else goes to stderr.

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

public final class RunningTotals {
    private static final String AMOUNT_FIELD = "\"amount\":";

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

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 7) {
            System.err.println(
                "usage: RunningTotals <bootstrap> <source> <output> <application id> <processing guarantee> "
                    + "<commit interval ms> <expected messages> [<state dir> [<threads> [<cache bytes>]]]");
            System.exit(2);
        }
        String bootstrap = args[0];
        String source = args[1];
        String output = args[2];
        String applicationId = args[3];
        String guarantee = args[4];
        long commitIntervalMs = Long.parseLong(args[5]);
        long expected = Long.parseLong(args[6]);
        String stateDir = args.length > 7 ? args[7] : null;
        int threads = args.length > 8 ? Integer.parseInt(args[8]) : 1;
        Long cacheBytes = args.length > 9 ? Long.valueOf(args[9]) : null;

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

        AtomicLong processed = new AtomicLong();
        CountDownLatch allProcessed = new CountDownLatch(1);
        AtomicLong countedAt = new AtomicLong();

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(source, Consumed.with(Serdes.String(), Serdes.String()))
            .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
            .aggregate(
                () -> 0L,
                (key, value, total) -> {
                    long updated = total + amount(value);
                    if (processed.incrementAndGet() == expected) {
                        countedAt.set(System.nanoTime());
                        allProcessed.countDown();
                    }
                    return updated;
                },
                Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("totals")
                    .withKeySerde(Serdes.String())
                    .withValueSerde(Serdes.Long()))
            .toStream()
            .mapValues((key, total) -> "{\"customer\":\"" + key + "\",\"total\":" + total + "}")
            .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
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

        long began = System.nanoTime();
        streams.start();
        boolean done = allProcessed.await(30, TimeUnit.MINUTES);
        long counted = countedAt.get();
        boolean closed = streams.close(Duration.ofMinutes(2));
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
            (closedAt - began) / 1e9,
            running == 0 ? -1.0 : (running - began) / 1e9);
    }
}
