"""The Kafka bridge as a Spark Structured Streaming job (optional extra ``spark``).

Importing this package needs no Spark; the modules that do import pyspark inside.
"""
