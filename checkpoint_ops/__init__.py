"""spark-checkpoint-ops: safe, audited operations on Spark Structured Streaming checkpoints."""

__version__ = "0.1.0"
