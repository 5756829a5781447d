"""One writer per checkpoint needs a limit on the pools ``checkpoint-<query>``: without one, Dagster runs a
query's stream, its backup and its compaction at the same time (the leases then refuse all but one, so
nothing is damaged, but runs fail). Say so, naming the ``dagster.yaml`` stanza to add."""

import dagster as dg

from dagster_checkpoint_ops.query import pool_name

STANZA = "concurrency:\n  pools:\n    default_limit: 1"


def pool_limit_warning(instance: dg.DagsterInstance, query: str) -> str | None:
    """The warning to log when the instance sets no limit for ``query``'s pool (None: it has one)."""
    pool = pool_name(query)
    try:
        if instance.get_concurrency_config().pool_config.default_pool_limit is not None:
            return None
        limits = instance.event_log_storage.get_concurrency_keys()
        if pool in limits:
            return None
    except Exception:  # noqa: BLE001 - an instance without concurrency support: nothing to judge
        return None
    return (f"the Dagster instance sets no limit for the pool {pool}, so runs of {query}, its backups and "
            f"compactions may overlap (the checkpoint's lease then fails all but one); add to dagster.yaml:\n"
            f"{STANZA}")


def warn_if_pool_unlimited(context) -> None:
    for query in context.assets_def.keys if hasattr(context, "assets_def") else ():
        note = pool_limit_warning(context.instance, query.to_user_string())
        if note:
            context.log.warning(note)
