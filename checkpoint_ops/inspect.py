"""``inspect`` and ``offsets``: what a checkpoint holds, as data (JSON keys are a public contract)."""

from __future__ import annotations

from datetime import datetime, timezone

from .errors import BadInputError, require_batch_number
from .fence import recovery_advice
from .lease import lease_of
from .pairing import check_pairing
from .model.checkpoint import Checkpoint
from .model.logfile import TORN_LOG_FIX, LogFormatError
from .model.sink import SinkOutput
from .model.sources import read_kafka_initial_offsets
from .window import rollback_window


def _first_last(ids) -> dict:
    ids = list(ids)
    return {"first": min(ids) if ids else None, "last": max(ids) if ids else None}


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _watermark(ms: int | None) -> str:
    """A watermark for the text output: its time (0: no event time seen yet), with Spark's milliseconds."""
    if not ms:
        return "watermark 0 (none yet)" if ms == 0 else "watermark unknown"
    return f"watermark {_iso(ms)} ({ms} ms)"


def inspect_checkpoint(ckpt: Checkpoint, sinks: list[SinkOutput] = (), ledger=None, *, sets=None,
                       batches: bool = True) -> dict:
    """What the checkpoint holds (JSON keys: docs/cli.md). ``sets`` (a ``restart.RestartSets`` of the same
    checkpoint, sinks and ledger) lets a caller share the rollback window's work with fsck.

    ``batches=False`` leaves out the per-batch list (the ``batches`` key), and with it the reading of every
    retained offsets and commits file (10,000 files at 10,000 retained batches): for a caller that judges
    those files elsewhere with the verdict cache (``check_pass``: fsck reads each once, then only what is
    new) and reports no per-batch list. ``damaged`` then names only the files inspect still read."""
    if ckpt.kind == "dstream":
        return inspect_dstream(ckpt)
    damaged: list[LogFormatError] = []  # files inspect read and could not use: shown, never fatal
    offsets = ckpt.load_offsets(errors=damaged) if batches else {}
    commits = ckpt.load_commits(errors=damaged) if batches else {}
    latest = ckpt.latest_offsets
    try:
        query_id = ckpt.query_id
    except LogFormatError as e:
        query_id = None
        damaged.append(e)
    if ckpt.metadata_error is not None:
        damaged.append(ckpt.metadata_error)
    report: dict = {
        "path": ckpt.url,
        "kind": "structured",
        "query_id": query_id,
        "fenced": {"operation": ckpt.fence.operation, "op_id": ckpt.fence.op_id, "journal": ckpt.fence.journal,
                   "fix": recovery_advice(ckpt.fence, ckpt.url)} if ckpt.fence else None,
        "offsets": _first_last(ckpt.offset_files),
        "commits": _first_last(ckpt.commit_files),
        "last_committed_batch": ckpt.latest_commit,
        "in_progress_batch": ckpt.latest_offset
        if ckpt.latest_offset is not None and (ckpt.latest_commit is None or ckpt.latest_offset > ckpt.latest_commit)
        else None,
        "batches": [
            {
                "id": b,
                "timestamp_ms": o.timestamp_ms,
                "time": _iso(o.timestamp_ms),
                "watermark_ms": o.watermark_ms,
                "committed": b in commits,
            }
            for b, o in offsets.items()
        ] if batches else None,
        "sources": _sources(ckpt, latest, damaged),
        "state": _state(ckpt, damaged),
        "rollback_window": rollback_window(ckpt, list(sinks), ledger, sets=sets).to_dict(),
        "lease": lease_of(ckpt.fm, ckpt.root, ckpt.listing).to_dict(),
    }
    if sinks:
        try:
            pairing = [v.to_dict() for v in check_pairing(ckpt, list(sinks), ledger, complete=True)]
        except BadInputError as e:  # a pairing record that is not one: named, like any damaged file
            damaged.append(e)
            pairing = [None] * len(sinks)
        report["sinks"] = [{**_sink(s, damaged), "pairing": p} for s, p in zip(sinks, pairing)]
        report["sink"] = report["sinks"][0]
    report["damaged"] = [{"path": e.path, "problem": e.problem} for e in
                         {e.path: e for e in damaged}.values()]
    return report


def _sources(ckpt: Checkpoint, latest, damaged: list) -> list[dict]:
    out = []
    dirs = ckpt.sources
    ids = [o.source_id for o in latest.offsets] if latest else sorted(dirs)
    for index, sid in enumerate(ids):
        so = latest.source(sid) if latest else None
        src = dirs.get(sid)
        kind = so.kind if so else "none"
        if src is not None and src.kind in ("file", "kafka"):
            kind = src.kind
        entry = {"id": sid, "index": index, "kind": kind, "offset": so.value if so else None,
                 "batch": latest.batch_id if latest else None}
        if src is not None and src.log is not None:
            log = src.log
            entry["log"] = {"latest": log.latest, "compact_interval": log.interval, "files": len(log.files)}
        if src is not None and src.kind == "kafka":
            try:
                entry["initial_offsets"] = read_kafka_initial_offsets(ckpt.listing, src)
            except LogFormatError as e:
                entry["initial_offsets"] = None
                damaged.append(e)
        out.append(entry)
    return out


def _state(ckpt: Checkpoint, damaged: list) -> dict:
    st = ckpt.state
    st.operator_metadata()
    catalog = ckpt.operator_files
    ops = []
    for op in sorted(st.operators.values(), key=lambda o: o.op_id):
        first, last = st.version_range(op)
        info = catalog.describe(op, ckpt.latest_offset)
        declared = op.declared[1]
        ops.append(
            {
                "id": op.op_id,
                "name": info.name or op.name,
                "partitions": len(op.partitions),
                "declared_partitions": declared,  # the operator metadata's (None: no metadata read)
                # partition directories at or beyond what the metadata declares: Spark never reads them
                "partitions_beyond_declared": (sum(1 for p in op.partitions if p >= declared)
                                               if declared is not None else 0),
                "stores": op.store_names,
                "versions": {"first": first, "last": last},
                # its stores' sums: state files with RocksDB's SST and log files, as each store's figures
                "files": sum(store.files for store in info.stores),
                "bytes": sum(store.bytes for store in info.stores),
                **info.to_dict(),
            }
        )
    damaged += catalog.problems()  # unreadable operator files: shown, never fatal (fsck says what to do)
    return {
        "provider": st.provider,
        "checkpoint_format_version": ckpt.checkpoint_format_version,
        "changelog_checkpointing": any(s.has_changelog for s in st.stores()) if st.provider == "rocksdb" else None,
        "operators": ops,
    }


def _partitions(op: dict) -> str:
    declared = op.get("declared_partitions")
    beyond = op.get("partitions_beyond_declared") or 0
    within = op["partitions"] - beyond
    if declared is None or (within == declared and not beyond):
        return f"{op['partitions']} partitions"
    text = (f"{declared} partitions" if within == declared else
            f"{within} of the {declared} partitions its metadata declares")
    if beyond:
        text += (f" (and {beyond} director{'y' if beyond == 1 else 'ies'} beyond them, which Spark does not "
                 "read)")
    return text


def _sink(sink: SinkOutput, damaged: list) -> dict:
    log = sink.log
    try:
        entries = log.entries_after(log.latest) if log.latest is not None else []
    except LogFormatError as e:
        damaged.append(e)
        entries = []
    return {
        "path": sink.url,
        "latest_batch": log.latest,
        "compact_interval": log.interval,
        "compact_interval_source": log.interval_source,
        "files": len(entries),
        "bytes": sum(int(e.doc.get("size") or 0) for e in entries),
    }


def inspect_dstream(ckpt: Checkpoint) -> dict:
    m = ckpt.dstream
    return {
        "path": ckpt.url,
        "kind": "dstream",
        "checkpoints": [
            {"time_ms": c.time_ms, "time": _iso(c.time_ms), "file": c.rel, "bytes": c.size, "backup": c.backup_rel}
            for c in m.checkpoints
        ],
        "latest_checkpoint_ms": m.latest.time_ms if m.latest else None,
        "received_block_logs": [
            {"start_ms": s, "end_ms": e, "file": rel, "bytes": size} for s, e, rel, size in m.block_logs
        ],
        "received_data_logs": m.received_data_logs,
        "temp_file": m.temp_file,
    }


def batch_offsets(ckpt: Checkpoint, batch: int, ledger=None) -> dict:
    """Where batch N started (offsets of N-1) and ended (offsets of N), per source."""
    if ckpt.kind != "structured":
        raise BadInputError("offsets are a Structured Streaming concept; this is a DStream checkpoint", path=ckpt.url)
    require_batch_number(batch, "batch", ckpt.url)
    on_disk = batch in ckpt.offset_files
    end = ckpt.offsets(batch) if on_disk else (ledger.offsets(batch) if ledger and ledger.has("offsets", batch) else None)
    if end is None:
        have = sorted(ckpt.offset_files)
        span = f"offsets/ holds batches {have[0]}..{have[-1]}" if have else "offsets/ is empty"
        raise BadInputError(
            f"batch {batch} has no offsets file ({span})",
            path=ckpt.listing.url(f"offsets/{batch}"),
            fix="pick a batch inside that range (see `checkpoint-ops inspect`); older batches were purged "
            "after minBatchesToRetain unless a batch ledger recorded them",
        )
    prev, start_problem = _start_offsets(ckpt, batch, end, ledger) if batch > 0 else (None, None)
    commit_problem = None
    if on_disk:
        committed = batch in ckpt.commit_files
        if committed:  # damaged (a torn write): the offsets are still worth showing, with what is wrong beside them
            errors: list[LogFormatError] = []
            ckpt.load_commits([batch], errors=errors)
            if errors:
                commit_problem = {"path": errors[0].path, "problem": errors[0].problem, "fix": errors[0].fix}
    else:  # purged by Spark: the ledger recorded its commit as it recorded its offsets
        committed = batch in ckpt.commit_files or ledger.has("commits", batch)
    sources = []
    for so in end.offsets:
        start = prev.source(so.source_id) if prev else None
        sources.append(
            {
                "id": so.source_id,
                "kind": so.kind,
                "start": start.value if start else None,
                "end": so.value,
            }
        )
    return {
        "batch": batch,
        "timestamp_ms": end.timestamp_ms,
        "time": _iso(end.timestamp_ms),
        "watermark_ms": end.watermark_ms,
        "committed": committed,  # commits/N is there (``commit_problem``: it is, but damaged)
        "commit_problem": commit_problem,
        "start_problem": start_problem,  # offsets of batch N-1, where N started: damaged, torn, or a gap in the log
        "recorded_in": "checkpoint" if on_disk else "ledger",
        "start_known": batch == 0 or prev is not None,
        "sources": sources,
    }


def _start_offsets(ckpt: Checkpoint, batch: int, end, ledger) -> tuple:
    """Where ``batch`` started: (offsets of batch-1 or None, what is wrong with them or None). Damage there (or a
    gap in the log) is shown beside the answer rather than instead of it: where the batch ended is still worth
    showing. The batch ledger's copy answers when the file is gone or damaged."""
    prev, problem, rel = None, None, f"offsets/{batch - 1}"
    if (batch - 1) in ckpt.offset_files:
        try:
            prev = ckpt.offsets(batch - 1)
        except LogFormatError as e:
            problem = _problem(e)
        if prev is not None and len(prev.offsets) != len(end.offsets):
            problem = {"path": ckpt.listing.url(rel), "problem": f"it lists {len(prev.offsets)} sources but "
                       f"offsets/{batch} lists {len(end.offsets)} (a truncated write?)", "fix": TORN_LOG_FIX}
            prev = None
        if problem is None:
            return prev, None
    elif any(b < batch - 1 for b in ckpt.offset_files):
        problem = {"path": ckpt.listing.url(rel), "problem": "missing, though older offsets files remain (the offsets "
                   "log has a gap there)", "fix": "restore it from a backup (`checkpoint-ops fsck` judges the whole "
                   "log)"}
    try:
        if ledger is not None and ledger.has("offsets", batch - 1):
            return ledger.offsets(batch - 1), problem
    except BadInputError as e:  # a damaged ledger: what is wrong on disk, if anything, comes first
        problem = problem or _problem(e)
    return None, problem


def _problem(e: BadInputError) -> dict:
    return {"path": e.path, "problem": e.problem, "fix": e.fix or "restore this file from a backup or roll back past it"}


# ---- human rendering -----------------------------------------------------------------------


def _lease_text(lease: dict) -> str:
    h = lease.get("holder")
    who = f"{h['owner']} (host {h['host']}, pid {h['pid']})" if h else "an unreadable lease record"
    if lease["state"] == "stale":
        return f"stale, held by {who}: {lease['stale_reason']} (the next operation takes it over)"
    if h and h.get("outlives_process"):
        return (f"held by {who}, which lost it to a takeover: every operation is refused until the record goes stale "
                "(a time to live after its last heartbeat)")
    return f"held by {who}: every operation is refused until it is released"


def render_inspect(r: dict) -> str:
    if r.get("kind") == "dstream":
        lines = [f"Legacy DStream checkpoint {r['path']}", f"  checkpoints: {len(r['checkpoints'])}"]
        for c in r["checkpoints"]:
            bk = f" (backup {c['backup']})" if c["backup"] else ""
            lines.append(f"    {c['time']}  {c['file']}  {c['bytes']} bytes{bk}")
        lines.append(f"  received block logs: {len(r['received_block_logs'])}")
        return "\n".join(lines)
    o, c = r["offsets"], r["commits"]
    lines = [
        f"Checkpoint {r['path']}",
        f"  query id:             {r['query_id']}",
        *([f"  FENCED:               {r['fenced']['operation']} ({r['fenced']['op_id']}) was interrupted: "
           + r["fenced"]["fix"]]
          if r.get("fenced") else []),
        *([f"  lease:                {_lease_text(r['lease'])}"] if r.get("lease", {}).get("state") != "free" else []),
        f"  offsets:              {o['first']}..{o['last']}" if o["first"] is not None else "  offsets:              (none)",
        f"  commits:              {c['first']}..{c['last']}" if c["first"] is not None else "  commits:              (none)",
        f"  last committed batch: {r['last_committed_batch']}",
    ]
    if r["in_progress_batch"] is not None:
        lines.append(f"  in-progress batch:    {r['in_progress_batch']} (planned, not committed: Spark re-runs it)")
    if r["batches"]:
        last = r["batches"][-1]
        lines.append(f"  last batch time:      {last['time']}  {_watermark(last['watermark_ms'])}")
    lines.append("  sources:")
    for s in r["sources"]:
        log = f"  (log {s['log']['files']} files, compact every {s['log']['compact_interval']})" if "log" in s else ""
        name = f"source {s['id']}" if s["id"] == str(s["index"]) else f"source {s['index']} ({s['id']})"
        lines.append(f"    {name}: {s['kind']} at {s['offset']}{log}")
    st = r["state"]
    if st["operators"]:
        fmt = f", checkpoint format V{st['checkpoint_format_version']}" if st["checkpoint_format_version"] else ""
        lines.append(f"  state: {st['provider']}{fmt}")
        for op in st["operators"]:
            v = op["versions"]
            lines.append(
                f"    operator {op['id']} {op['name'] or ''}: {_partitions(op)}, stores {op['stores']}, "
                f"versions {v['first']}..{v['last']}, {op['files']} files"
            )
            lines += _render_operator(op)
    else:
        lines.append("  state: (stateless)")
    w = r["rollback_window"]
    if w.get("with_recorded_sinks"):
        lines.append("  rollback window with the file sinks the batch ledger records (a rollback takes them): "
                     + ", ".join(w["with_recorded_sinks"]))
    if w["earliest"] is not None:
        lines.append(f"  rollback window:      batches {w['earliest']}..{w['latest']}")
        lines.append(f"    earlier is out of reach: {w['earliest_reason']}")
        if w.get("latest_reason"):
            lines.append(f"    later is out of reach: {w['latest_reason']}")
    else:
        lines.append(f"  rollback window:      none ({w['earliest_reason']})")
    for d in r.get("damaged", []):
        lines.append(f"  DAMAGED: {d['path']}: {d['problem']}")
    for s in r.get("sinks", []):
        lines.append(
            f"  sink {s['path']}: latest batch {s['latest_batch']}, {s['files']} files, {s['bytes']} bytes, "
            f"compact every {s['compact_interval']}"
        )
        p = s.get("pairing")
        if p:
            verdict = p["status"] if p["ok"] else f"{p['status']} (not this checkpoint's output)"
            lines.append(f"    pairing: {verdict}: {p['evidence']}")
    return "\n".join(lines)


def _render_operator(op: dict) -> list[str]:
    """The stores of one operator: size, key and value schema (per column family), schema files."""
    lines = []
    md = op.get("metadata")
    if md is not None:
        props = md.get("properties") or {}
        extra = ", ".join(f"{k} {props[k]}" for k in ("timeMode", "outputMode") if k in props)
        lines.append(f"      metadata {md['path']} (v{md['format_version']}{', ' + extra if extra else ''})")
    for store in op.get("state_stores", []):
        v = store["versions"]
        lines.append(f"      store {store['name']}: {store['partitions']} partitions, versions {v['first']}..{v['last']}, "
                     f"{store['files']} files, {store['bytes']} bytes")
        families = store["column_families"]
        if len(families) == 1 and families[0]["name"] == "default":
            lines.append(f"        key   {families[0]['key_schema']}")
            lines.append(f"        value {families[0]['value_schema']}")
        else:
            for cf in families:
                lines.append(f"        column family {cf['name']}: key {cf['key_schema']}, value {cf['value_schema']}")
        for f in store["schema_files"]:
            b = f["batches"]
            what = f"v{f['format_version']}" if f["format_version"] else "UNREADABLE"
            lines.append(f"        schema {f['path']} ({what}, batches {b['first']}..{b['last']})")
    return lines


def render_offsets(r: dict) -> str:
    state = "committed" if r["committed"] else "not committed"
    where = "; purged by Spark, as the batch ledger recorded it" if r.get("recorded_in") == "ledger" else ""
    lines = [f"Batch {r['batch']} ({state}, planned at {r['time']}, {_watermark(r['watermark_ms'])}{where})"]
    unknown = ("(unknown: below)" if r.get("start_problem") else
               "(unknown: offsets of the previous batch were purged)")
    for s in r["sources"]:
        start = s["start"] if r["start_known"] else unknown
        if r["batch"] == 0:
            start = "(query start)"
        lines.append(f"  source {s['id']} ({s['kind']}): from {start} to {s['end']}")
    for what, damaged in (("where it started is unknown", r.get("start_problem")),
                          ("its commit is damaged", r.get("commit_problem"))):
        if damaged:
            lines.append(f"  {what}: {damaged['path']}: {damaged['problem']}")
            if damaged.get("fix"):
                lines.append(f"    fix: {damaged['fix']}")
    return "\n".join(lines)
