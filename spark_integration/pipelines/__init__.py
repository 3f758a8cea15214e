"""Jobs that run on Spark with ``format("orbit")``: the usage-metering pipeline (``metering``)
and the worked example for tenants (``example_parquet``). See docs/spark.md."""
