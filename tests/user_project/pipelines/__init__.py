"""The user's own `pipelines` package (not spark-checkpoint-ops')."""
