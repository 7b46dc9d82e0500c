"""Running a real Apache Kafka broker, from the jars on Maven Central, for development and tests."""
