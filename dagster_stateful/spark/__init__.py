"""PySpark jobs of dagster-stateful, as plain functions of a SparkSession (no dagster import)."""
