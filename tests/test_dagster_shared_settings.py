"""Python definitions that customise a shared setting beside a StreamingQueryComponent (which takes the defaults):
the load warns, naming the setting, both values and what to do, before Dagster's merge refuses."""

import dagster as dg
import pytest
from dagster.components.testing import create_defs_folder_sandbox

from dagster_checkpoint_ops import StreamingQuery, StreamingQueryComponent, streaming_definitions


def test_a_customised_shared_setting_beside_a_component_is_named_at_load(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKPOINT_OPS_HOME", str(tmp_path / "home"))
    custom = str(tmp_path / "team-backups")
    python_defs = streaming_definitions([StreamingQuery(name="py_q", build=None, checkpoint=str(tmp_path / "c"))],
                                        backup_url=custom)
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(
            component_cls=StreamingQueryComponent, defs_path="yaml_q",
            defs_yaml_contents={"type": "dagster_checkpoint_ops.StreamingQueryComponent",
                                "attributes": {"name": "yaml_q", "checkpoint": str(tmp_path / "y")}})
        with pytest.warns(UserWarning) as warned:
            with sandbox.load_component_and_build_defs(defs_path=defs_path) as (_, yaml_defs):
                with pytest.raises(dg.DagsterInvariantViolationError, match="streaming_settings"):
                    dg.Definitions.merge(python_defs, yaml_defs)
    (message,) = [str(w.message) for w in warned if "streaming_settings" in str(w.message)]
    assert message.startswith("streaming_definitions(backup_url=...) customises the shared resource "
                              "'streaming_settings'"), message
    assert repr(custom) in message and "StreamingQueryComponent 'yaml_q'" in message, message
    assert "per query" in message and "YAML backup_url:" in message, message
