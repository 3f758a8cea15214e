"""spark_integration."""
