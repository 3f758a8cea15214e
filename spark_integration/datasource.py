"""``format("orbit")``: Orbit topics as a PySpark 4 Python data source (batch and streaming,
read and write).

::

    from spark_integration import register
    register(spark)
    df = spark.read.format("orbit").option("namesrv", "127.0.0.1:9876").option("topic", "orders").load()
    df.write.format("orbit").option("namesrv", "127.0.0.1:9876").option("topic", "copy").mode("append").save()
    stream = spark.readStream.format("orbit").option("namesrv", "127.0.0.1:9876").option("topic", "orders").load()

Options are parsed (and checked) when Spark asks for the reader or writer, on the driver; the
objects shipped to executors hold the parsed options only (credentials redacted in reprs).
See docs/spark.md.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from spark_integration.batch_reader import SCHEMA, OrbitBatchReader
from spark_integration.client import TaskClient
from spark_integration.errors import OrbitSparkError
from spark_integration.options import ReadOptions, WriteOptions
from spark_integration.stream_reader import OrbitStreamReader
from spark_integration.stream_writer import OrbitStreamWriter
from spark_integration.writer import OrbitBatchWriter, check_schema


class OrbitDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "orbit"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return OrbitBatchReader(ReadOptions.parse(self.options).check_batch())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return OrbitStreamReader(ReadOptions.parse(self.options).check_stream())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return OrbitBatchWriter(self._write_options(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return OrbitStreamWriter(self._write_options(schema, overwrite))

    def _write_options(self, schema: StructType, overwrite: bool) -> WriteOptions:
        if overwrite:
            raise OrbitSparkError("Orbit topics are append-only: use mode('append') / outputMode('append')")
        opts = WriteOptions.parse(self.options)
        check_schema(schema, opts)
        with TaskClient(opts.namesrv, opts.credentials, request_timeout_ms=opts.request_timeout_ms) as c:
            c.run(c.check_credentials())  # a wrong secret fails here, before any task starts
        return opts

    def __repr__(self) -> str:
        return "OrbitDataSource()"


def register(spark: SparkSession) -> None:
    """Make ``format("orbit")`` available in this session."""
    spark.dataSource.register(OrbitDataSource)
