"""The user's own `resources` package (not spark-checkpoint-ops')."""
