"""Orbit for Apache Spark: the PySpark 4 Python data source ``format("orbit")`` (docs/spark.md)."""

from spark_integration.datasource import OrbitDataSource, register
from spark_integration.errors import OrbitSparkError

__all__ = ["OrbitDataSource", "OrbitSparkError", "register"]
