"""Settings for one run only, on the shared Spark session: set, unset, and each put back as it was."""

import pytest

from checkpoint_ops.session_settings import session_settings

UNSET_KEY = "spark.sql.streaming.checkpoint-ops-test.unset"  # set by nothing in this session
SET_KEY = "spark.sql.streaming.checkpoint-ops-test.set"


def test_settings_apply_in_the_block_and_are_put_back_set_or_unset(spark):
    spark.conf.set(SET_KEY, "shared")
    try:
        with pytest.raises(RuntimeError):
            with session_settings(spark, {UNSET_KEY: 7, SET_KEY: None}):
                assert spark.conf.get(UNSET_KEY) == "7"  # str() of the value
                assert spark.conf.get(SET_KEY, None) is None
                raise RuntimeError("the run failed")  # restored all the same
        assert spark.conf.get(UNSET_KEY, None) is None  # unset again, not pinned to what the block set
        assert spark.conf.get(SET_KEY) == "shared"
    finally:
        spark.conf.unset(SET_KEY)
