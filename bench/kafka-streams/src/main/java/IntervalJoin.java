// Kafka Streams' side of bench/bench_interval_join.py: orders left-joined with their payments.
//
// Usage: IntervalJoin <bootstrap> <orders> <payments> <output> <application id> <guarantee>
//                     <commit interval ms> <within ms> <grace ms> <expected records> <state dir>
//
// orders.leftJoin(payments, joiner, JoinWindows.ofTimeDifferenceAndGrace(within, grace).before(0)),
// both topics read with String serdes, the joined values (the order's JSON, the payment's fields
// added) sent to <output>. The clock starts right before KafkaStreams.start() (group join included,
// as the engine's run) and stops once <expected records> records of both topics went through the
// join; then the app closes. Prints one line:
//   RESULT records=<n> seconds=<s> results=<results sent by then>
// Everything else is Kafka Streams' default, one stream thread.

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;

public final class IntervalJoin {
    private IntervalJoin() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 11) {
            System.err.println("usage: IntervalJoin <bootstrap> <orders> <payments> <output> <application id> "
                + "<guarantee> <commit interval ms> <within ms> <grace ms> <expected records> <state dir>");
            System.exit(2);
        }
        String bootstrap = args[0];
        String ordersTopic = args[1];
        String paymentsTopic = args[2];
        String output = args[3];
        long within = Long.parseLong(args[7]);
        long grace = Long.parseLong(args[8]);
        long expected = Long.parseLong(args[9]);

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[4]);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args[5]);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(args[6]));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[10]);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

        AtomicLong seen = new AtomicLong();
        AtomicLong results = new AtomicLong();
        CountDownLatch allSeen = new CountDownLatch(1);
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> orders = builder.stream(ordersTopic, Consumed.with(Serdes.String(), Serdes.String()));
        KStream<String, String> payments =
            builder.stream(paymentsTopic, Consumed.with(Serdes.String(), Serdes.String()));
        orders = orders.peek((key, value) -> count(seen, expected, allSeen));
        payments = payments.peek((key, value) -> count(seen, expected, allSeen));
        orders
            .leftJoin(
                payments,
                (order, payment) -> payment == null
                    ? order
                    : order.substring(0, order.lastIndexOf('}')) + "," + payment.substring(1),
                JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(within), Duration.ofMillis(grace))
                    .before(Duration.ZERO),
                StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String()))
            .peek((key, value) -> results.incrementAndGet())
            .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        long started = System.nanoTime();
        streams.start();
        if (!allSeen.await(30, TimeUnit.MINUTES)) {
            System.err.println("timed out: " + seen.get() + " of " + expected + " records seen");
            System.exit(1);
        }
        double seconds = (System.nanoTime() - started) / 1e9;
        long sent = results.get();
        streams.close(Duration.ofSeconds(60));
        System.out.printf("RESULT records=%d seconds=%.3f results=%d%n", seen.get(), seconds, sent);
    }

    private static void count(AtomicLong seen, long expected, CountDownLatch allSeen) {
        if (seen.incrementAndGet() >= expected) {
            allSeen.countDown();
        }
    }
}
