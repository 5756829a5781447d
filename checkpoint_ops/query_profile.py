"""What a streaming query looks like to a restart, read from its unstarted ``DataStreamWriter`` without
running anything: its sources in plan order, its stateful operators, its output mode and its sink.

Spark keeps none of the sink, the output mode or a source's options in the checkpoint, so after a query
is accepted (a compatible ``compat`` verdict with ``--record``, or every Dagster materialization)
checkpoint-ops records its profile beside the checkpoint, in ``<parent>/.checkpoint-ops/<name>/
query-profile.json``. ``compat`` compares the next query with it (and with Spark's own files).

What Spark checks at a restart is not all that changes a restarted query's output: a file sink's ``partitionBy``
columns (its readers infer partitions from the directories of all its files) and the durations of an
aggregation's time windows (the state's key is ``struct<start, end>`` whatever they are) are recorded too, and so
is the code of every UDF (the plan prints a UDF as its name and arguments alone, ``<lambda>(v)``). A field an
earlier release did not record is None: unknown, which ``compat`` never reports as a difference.

The profile is read through the Spark session's JVM (py4j) on classic PySpark. Under Spark Connect only
the writer's own settings are visible (output mode, sink, its options): ``sources``, ``operators``, ``udfs`` and
``fingerprint`` are then None, and ``compat`` relies on Spark's verdict for them.

No PySpark import here: the objects come from the caller.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pickle
import re
import time
import types
from dataclasses import dataclass

from .errors import BadInputError, StorageError, problem_of
from .journal import ops_dir
from .storage import CheckpointFileManager
from .storage.paths import join

PROFILE_FILE = "query-profile.json"
UNKNOWN = "unknown"
PROFILE_FORMAT = 1

# Spark's short names of its file formats (and the file-format classes they stand for).
FILE_FORMATS = {"json", "parquet", "csv", "text", "orc", "avro", "xml", "binaryfile"}
# Options that only limit how much a source reads per micro-batch: the guide allows changing them.
RATE_LIMIT_OPTIONS = {"maxfilespertrigger", "maxbytespertrigger", "maxoffsetspertrigger", "minoffsetspertrigger",
                      "maxtriggerdelay", "maxrecordspertrigger", "rowspersecond"}
# Settings Spark does not pin in the offsets log that change how it judges a restart: part of the fingerprint.
JUDGE_SETTINGS = ("spark.sql.streaming.stateStore.checkpointFormatVersion",
                  "spark.sql.streaming.stateStore.stateSchemaCheck",
                  "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                  "spark.sql.streaming.statefulOperator.checkCorrectness.enabled")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_STATEFUL = {
    "Aggregate": "aggregation", "Distinct": "aggregation", "Deduplicate": "deduplication",
    "DeduplicateWithinWatermark": "deduplication within watermark", "FlatMapGroupsWithState": "flatMapGroupsWithState",
    "FlatMapGroupsInPandasWithState": "applyInPandasWithState", "TransformWithState": "transformWithState",
    "TransformWithStateInPySpark": "transformWithState", "GlobalLimit": "limit",
}


@dataclass(frozen=True)
class SourceProfile:
    """One source, at its position in the plan (Spark numbers sources in this order: ``sources/<index>``)."""

    index: int
    kind: str  # file | kafka | rate | socket | <format>
    format: str  # as given to readStream.format (or the provider class)
    path: str | None  # file sources: the path as given
    options: tuple[tuple[str, str], ...] = ()  # sorted, keys lower-cased, without path

    @property
    def option_map(self) -> dict[str, str]:
        return dict(self.options)

    def describe(self) -> str:
        return f"{self.format} source" + (f" at {self.path}" if self.path else "")

    def to_dict(self) -> dict:
        return {"index": self.index, "kind": self.kind, "format": self.format, "path": self.path,
                "options": dict(self.options)}

    @classmethod
    def from_dict(cls, doc: dict) -> "SourceProfile":
        return cls(doc["index"], doc["kind"], doc["format"], doc.get("path"),
                   tuple(sorted((str(k), str(v)) for k, v in (doc.get("options") or {}).items())))


@dataclass(frozen=True)
class OperatorProfile:
    """One stateful operator of the logical plan, top down (``detail``: its keys, aggregates, join type).

    ``windows``: how an aggregation's time-window keys are computed, as Spark's ``window(...)`` call
    (``window(ts, '20 seconds')``); the key's type (``struct<start,end>``) is the same whatever the durations,
    so the state schema does not show them. Empty: no time-window key. None: unknown (a profile recorded by an
    earlier release, or a window this release cannot read), and then never a difference."""

    index: int
    kind: str  # aggregation | deduplication | join | flatMapGroupsWithState | transformWithState | limit | ...
    detail: str
    windows: tuple[str, ...] | None = None

    def describe(self) -> str:
        detail = "; ".join([self.detail, *(self.windows or ())]) if self.detail else ""
        return f"{self.kind} ({detail})" if detail else self.kind

    def same_as(self, other: "OperatorProfile") -> bool:
        """The same operator as far as both profiles know (an unknown ``windows`` matches any)."""
        return (self.kind, self.detail) == (other.kind, other.detail) and (
            self.windows is None or other.windows is None or self.windows == other.windows)

    def to_dict(self) -> dict:
        return {"index": self.index, "kind": self.kind, "detail": self.detail,
                "windows": None if self.windows is None else list(self.windows)}

    @classmethod
    def from_dict(cls, doc: dict) -> "OperatorProfile":
        windows = doc.get("windows")
        return cls(doc["index"], doc["kind"], doc.get("detail", ""), None if windows is None else tuple(windows))


@dataclass(frozen=True)
class SinkProfile:
    kind: str  # file | foreachBatch | foreach | kafka | noop | console | memory | <format> | unknown
    format: str
    path: str | None  # file sinks: the output directory as given
    # ``partitionBy`` columns in order (empty: none). None: unknown (a profile recorded by an earlier release,
    # or a writer this release cannot read), and then never a difference.
    partition_by: tuple[str, ...] | None = None

    def describe(self) -> str:
        return f"{self.kind} sink" + (f" at {self.path}" if self.path else "") + self.partitioning()

    def partitioning(self) -> str:
        if self.partition_by is None:
            return ""
        return f" partitioned by {', '.join(self.partition_by)}" if self.partition_by else " not partitioned"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "format": self.format, "path": self.path,
                "partition_by": None if self.partition_by is None else list(self.partition_by)}

    @classmethod
    def from_dict(cls, doc: dict) -> "SinkProfile":
        columns = doc.get("partition_by")
        return cls(doc["kind"], doc.get("format", doc["kind"]), doc.get("path"),
                   None if columns is None else tuple(str(c) for c in columns))


@dataclass(frozen=True)
class UdfProfile:
    """One user-defined function call in the plan, in plan order (pre-order, each node's expressions in order).

    ``code``: a hash of what the function computes, None when it cannot be read (a Scala or Java UDF: the JVM
    keeps a compiled closure). For a Python UDF it hashes the function itself as this process has it: its
    bytecode, constants and names (not its file or line numbers), its defaults and closure, and every global it
    refers to (helper functions the same way, other values by their ``repr``), so moving or reformatting the code
    keeps the hash, and changing the body, a helper or a constant it reads changes it. ``state``: the call is in
    the part of the plan the state is computed from (a stateful operator, or a node below one except filters)."""

    kind: str  # the expression's class: PythonUDF | PythonUDAF | ScalaUDF | ScalaUDAF | ScalaAggregator | ...
    name: str
    code: str | None
    state: bool

    def describe(self) -> str:
        lang = "Python" if self.kind.startswith("Python") else "JVM"
        return f"{lang} UDF {self.name}" + (f" (code {self.code[:12]})" if self.code else " (code unknown)")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "code": self.code, "state": self.state}

    @classmethod
    def from_dict(cls, doc: dict) -> "UdfProfile":
        return cls(str(doc["kind"]), str(doc["name"]), doc.get("code"), bool(doc.get("state")))


@dataclass(frozen=True)
class QueryProfile:
    """A query's shape as far as a restart is concerned. ``plan_hash`` hashes the canonical analyzed plan;
    ``fingerprint`` hashes it with the output mode, the Spark version and the settings that change how Spark
    judges a restart (``JUDGE_SETTINGS``): equal fingerprints mean Spark would judge the same query.
    ``state_hash`` hashes the part of the plan the state is computed from: the stateful operators and every
    node below them except filters (which only choose rows). Equal state hashes with other plan hashes: only
    filters, or what comes after the stateful operators, changed. None: unknown (an earlier release's
    profile, a plan that cannot be read). ``udfs``: the UDF calls of the plan with their code (neither hash sees
    a UDF's code); None: unknown (an earlier release's profile, Spark Connect, a plan that cannot be read)."""

    output_mode: str  # append | update | complete (unknown: the writer could not be read)
    sink: SinkProfile
    sources: tuple[SourceProfile, ...] | None
    operators: tuple[OperatorProfile, ...] | None
    fingerprint: str | None
    spark_version: str
    plan_hash: str | None = None
    state_hash: str | None = None
    udfs: tuple[UdfProfile, ...] | None = None

    @property
    def stateful(self) -> bool | None:
        return None if self.operators is None else bool(self.operators)

    def to_dict(self) -> dict:
        return {"output_mode": self.output_mode, "sink": self.sink.to_dict(),
                "sources": None if self.sources is None else [s.to_dict() for s in self.sources],
                "operators": None if self.operators is None else [o.to_dict() for o in self.operators],
                "fingerprint": self.fingerprint, "plan_hash": self.plan_hash, "state_hash": self.state_hash,
                "udfs": None if self.udfs is None else [u.to_dict() for u in self.udfs],
                "spark_version": self.spark_version}

    @classmethod
    def from_dict(cls, doc: dict) -> "QueryProfile":
        sources, operators, udfs = doc.get("sources"), doc.get("operators"), doc.get("udfs")
        return cls(doc["output_mode"], SinkProfile.from_dict(doc["sink"]),
                   None if sources is None else tuple(SourceProfile.from_dict(s) for s in sources),
                   None if operators is None else tuple(OperatorProfile.from_dict(o) for o in operators),
                   doc.get("fingerprint"), doc.get("spark_version", ""), doc.get("plan_hash"), doc.get("state_hash"),
                   None if udfs is None else tuple(UdfProfile.from_dict(u) for u in udfs))


@dataclass(frozen=True)
class ProfileRecord:
    """A profile recorded beside a checkpoint: a query accepted for it, when, and from which batch on."""

    profile: QueryProfile
    recorded_at: str  # UTC, ISO 8601
    judged: bool  # Spark restarted this exact query (fingerprint) on a copy of the checkpoint and accepted it
    batch: int | None = None  # the checkpoint's last committed batch when it was first recorded (it ran those after)
    # the checkpoint's query id (its ``metadata``) when recorded: None when not known (recorded before Spark created
    # the checkpoint, or by an earlier release). A record of another id is of a checkpoint that was at this place.
    query_id: str | None = None

    def proven(self, fingerprint: str | None, latest_commit: int | None) -> bool:
        """Whether Spark already accepted the query with ``fingerprint`` on this checkpoint: its own restart on
        a copy did, or the query ran on the checkpoint since it was recorded (it committed a later batch). A record
        made before anything committed (``batch`` None) counts only with the checkpoint's query id: one made before
        Spark created the checkpoint (earlier releases recorded a Dagster run's query before the run, also one
        refused before its query started) proves nothing about the query that then created it, which may be
        another: Spark judges once more."""
        if fingerprint is None or self.profile.fingerprint != fingerprint:
            return False
        if self.judged:
            return True
        if latest_commit is None:
            return False
        return latest_commit > self.batch if self.batch is not None else self.query_id is not None

    def to_dict(self) -> dict:
        return {"format": PROFILE_FORMAT, "recorded_at": self.recorded_at, "judged": self.judged,
                "batch": self.batch, "query_id": self.query_id, "profile": self.profile.to_dict()}


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM on this side)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def describe_query(spark, writer) -> QueryProfile:
    """The profile of an unstarted ``DataStreamWriter`` (nothing runs, nothing is written)."""
    if is_connect(spark):
        return _describe_connect(spark, writer)
    jvm = spark._jvm
    try:
        fields = _writer_fields(writer._jwrite, ("source", "outputMode", "extraOptions"))
    except Exception:  # another Spark's writer: its sink and output mode stay unknown, Spark still judges
        output_mode, sink = UNKNOWN, SinkProfile(UNKNOWN, UNKNOWN, None)
    else:
        options = _scala_map(jvm, fields["extraOptions"].originalMap()) if fields["extraOptions"] is not None else {}
        fmt = fields["source"] or "parquet"  # Spark's default sink format (spark.sql.sources.default)
        output_mode = str(fields["outputMode"].toString()).lower() if fields["outputMode"] is not None else "append"
        sink = SinkProfile(_sink_kind(fmt), fmt, options.get("path"), _partition_columns(writer._jwrite))
    plan = writer._df._jdf.queryExecution().analyzed()
    try:
        sources, operators = [], []
        for node in _walk(plan):
            name = node.getClass().getSimpleName()
            if name in ("StreamingRelation", "StreamingRelationV2"):
                sources.append(_source(jvm, node, name, len(sources)))
            elif node.isStreaming() and _is_stateful(node, name):
                operators.append(_operator(node, name, len(operators)))
    except Exception:  # a plan node this release does not know how to read: Spark's restart judges them
        sources, operators = None, None
    plan_hash = _plan_hash(plan)
    settings = [f"{key}={_setting(spark, key)}" for key in JUDGE_SETTINGS]
    fingerprint = None if plan_hash is None else _sha256([plan_hash, output_mode, spark.version, *settings])
    return QueryProfile(output_mode, sink, None if sources is None else tuple(sources),
                        None if operators is None else tuple(operators), fingerprint, spark.version, plan_hash,
                        None if operators is None else _state_hash(plan), _udfs(jvm, plan))


def _describe_connect(spark, writer) -> QueryProfile:
    proto = writer._write_proto
    options = {str(k): str(v) for k, v in proto.options.items()}
    if proto.HasField("foreach_batch"):
        fmt = "foreachBatch"
    elif proto.HasField("foreach_writer"):
        fmt = "foreach"
    else:
        fmt = proto.format or "parquet"
    path = proto.path if proto.HasField("path") else options.get("path")
    sink = SinkProfile(_sink_kind(fmt), fmt, path, tuple(str(c) for c in proto.partitioning_column_names))
    return QueryProfile((proto.output_mode or "append").lower(), sink, None, None, None, spark.version)


def _writer_fields(jwrite, names) -> dict:
    """Private fields of the JVM ``DataStreamWriter`` (Spark offers no getter for them)."""
    cls = jwrite.getClass()
    out = {}
    for name in names:
        field = cls.getDeclaredField(name)
        field.setAccessible(True)
        out[name] = field.get(jwrite)
    return out


def _partition_columns(jwrite) -> tuple[str, ...] | None:
    """The writer's ``partitionBy`` columns (empty: none), None when this Spark's writer does not say."""
    try:
        columns = _writer_fields(jwrite, ("partitioningColumns",))["partitioningColumns"]
        if columns is None or not columns.isDefined():
            return ()
        names = columns.get()
        return tuple(str(names.apply(i)) for i in range(names.size()))
    except Exception:  # another Spark's writer: unknown, never a difference
        return None


def _scala_map(jvm, scala_map) -> dict[str, str]:
    return _java_map(jvm.scala.jdk.javaapi.CollectionConverters.asJava(scala_map))


def _java_map(java_map) -> dict[str, str]:
    """The map's entries, walked with ``hasNext`` (py4j's own iteration ends on a Java exception, which
    PySpark converts at about 10 ms each: one per map, a map per source and the writer's per profile)."""
    entries = java_map.entrySet().iterator()
    out = {}
    while entries.hasNext():
        entry = entries.next()
        out[str(entry.getKey())] = str(entry.getValue())
    return out


def _walk(node):
    """Pre-order, left to right, over a plan (the order in which Spark numbers sources: ``sources/0``,
    ``sources/1``) or an expression tree."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        children = current.children()
        stack.extend(children.apply(i) for i in reversed(range(children.size())))


def _is_stateful(node, name: str) -> bool:
    if name == "Join":
        return node.left().isStreaming() and node.right().isStreaming()
    return name in _STATEFUL


def _sql(expressions) -> list[str]:
    return [str(expressions.apply(i).sql()) for i in range(expressions.size())]


def _typed(expressions) -> list[str]:
    return [f"{expressions.apply(i).sql()}: {expressions.apply(i).dataType().simpleString()}"
            for i in range(expressions.size())]


def _operator(node, name: str, index: int) -> OperatorProfile:
    if name == "Join":
        condition = node.condition()
        on = f" on {condition.get().sql()}" if condition.isDefined() else ""
        return OperatorProfile(index, "join", f"{node.joinType().toString()}{on}")
    if name == "Aggregate":
        keys = _typed(node.groupingExpressions())
        grouping = set(_sql(node.groupingExpressions()))
        aggregates = [a for a in _sql(node.aggregateExpressions()) if a not in grouping]
        return OperatorProfile(index, "aggregation", f"keys {', '.join(keys) or 'none'}; "
                                                     f"aggregates {', '.join(aggregates) or 'none'}", _windows(node))
    if name in ("Deduplicate", "DeduplicateWithinWatermark"):
        return OperatorProfile(index, _STATEFUL[name], f"keys {', '.join(_typed(node.keys()))}", ())
    if name == "Distinct":
        return OperatorProfile(index, "aggregation", "distinct rows", ())
    return OperatorProfile(index, _STATEFUL[name], "", ())


def _windows(aggregate) -> tuple[str, ...] | None:
    """The time-window keys of an ``Aggregate`` as ``window(...)`` calls, read from what Spark's analyzer
    (``TimeWindowing``) made of them: a ``Project`` (tumbling) or ``Expand`` (sliding) below the aggregate
    computes each window as ``named_struct(start, ts - (ts - startTime) % slide - i * slide, end, start +
    duration)``. None when one of them cannot be read that way (a session window, another Spark)."""
    try:
        grouping = aggregate.groupingExpressions()
        out = []
        for i in range(grouping.size()):
            key = grouping.apply(i)
            if key.getClass().getSimpleName() != "AttributeReference":
                continue
            if key.metadata().contains("spark.sessionWindow"):
                return None
            if not key.metadata().contains("spark.timeWindow"):
                continue
            definition = _defining_expression(aggregate.child(), key.exprId())
            text = None if definition is None else _window_call(definition)
            if text is None:
                return None
            out.append(text)
        return tuple(out)
    except Exception:  # a plan shape this release does not know: unknown, never a difference
        return None


def _defining_expression(plan, expr_id):
    """The expression a ``Project`` (an alias) or ``Expand`` (its first projection) computes ``expr_id`` with."""
    for node in _walk(plan):
        name = node.getClass().getSimpleName()
        if name == "Project":
            projected = node.projectList()
            for i in range(projected.size()):
                item = projected.apply(i)
                if item.getClass().getSimpleName() == "Alias" and item.exprId().equals(expr_id):
                    return item.child()
        elif name == "Expand":
            output = node.output()
            for i in range(output.size()):
                if output.apply(i).exprId().equals(expr_id):
                    return node.projections().apply(0).apply(i)
    return None


def _literal(expression) -> int | None:
    if expression.getClass().getSimpleName() != "Literal" or expression.value() is None:
        return None
    return int(expression.value())


def _window_call(definition) -> str | None:
    """``window(ts, 'duration'[, 'slide'[, 'start']])`` from the struct ``TimeWindowing`` builds."""
    if definition.getClass().getSimpleName() != "CreateNamedStruct":
        return None
    names, values = _sql(definition.nameExprs()), definition.valExprs()
    if names != ["'start'", "'end'"]:
        return None
    remainder = next((e for e in _walk(values.apply(0)) if e.getClass().getSimpleName() == "Remainder"), None)
    end = next((e for e in _walk(values.apply(1)) if e.getClass().getSimpleName() == "Add"), None)
    if remainder is None or end is None or remainder.left().getClass().getSimpleName() != "Subtract":
        return None
    slide, start, duration = _literal(remainder.right()), _literal(remainder.left().right()), _literal(end.right())
    column = next((e for e in _walk(remainder.left().left())
                   if e.getClass().getSimpleName() == "AttributeReference"), None)
    if None in (slide, start, duration) or column is None:
        return None
    args = [str(column.name()), _micros_text(duration)]
    if slide != duration or start:
        args.append(_micros_text(slide))
    if start:
        args.append(_micros_text(start))
    return f"window({args[0]}, " + ", ".join(f"'{a}'" for a in args[1:]) + ")"


def _micros_text(micros: int) -> str:
    for unit, size in (("days", 86_400_000_000), ("hours", 3_600_000_000), ("minutes", 60_000_000),
                       ("seconds", 1_000_000), ("milliseconds", 1000)):
        if micros % size == 0:
            return f"{micros // size} {unit}"
    return f"{micros} microseconds"


def _source(jvm, node, name: str, index: int) -> SourceProfile:
    if name == "StreamingRelation":  # DataSource V1 (file, Kafka)
        ds = node.dataSource()
        fmt = str(ds.className())
        options = _scala_map(jvm, ds.options())
    else:  # V2 (rate, socket, ...)
        fmt = str(node.sourceName())
        options = _java_map(node.extraOptions().asCaseSensitiveMap())
    path = options.pop("path", None)
    kind = _format_kind(fmt)
    return SourceProfile(index, kind, fmt, path, tuple(sorted((k.lower(), v) for k, v in options.items())))


def _format_kind(fmt: str) -> str:
    short = fmt.rsplit(".", 1)[-1].lower()
    if fmt.lower() in FILE_FORMATS or short.endswith("fileformat"):
        return "file"
    if "kafka" in fmt.lower():
        return "kafka"
    return fmt.lower()


def _sink_kind(fmt: str) -> str:
    if fmt in ("foreachBatch", "foreach"):
        return fmt
    return _format_kind(fmt)


def _setting(spark, key: str) -> str | None:
    """The session's value of ``key`` (its default if unset), None when unset without a default. Asked as
    an Option on the JVM side: an unset key's exception would cost a PySpark conversion (about 10 ms)."""
    try:
        value = spark._jsparkSession.conf().getOption(key)
        return str(value.get()) if value.isDefined() else None
    except Exception:  # not a classic session's JVM API: ask as PySpark does
        try:
            return spark.conf.get(key)
        except Exception:  # unset, without a default
            return None


def _plan_hash(plan) -> str | None:
    """A hash of the canonical analyzed plan: expression ids normalized, watermark uuids (new for every
    DataFrame) removed. Settings the offsets log pins are not part of any hash: Spark applies the pinned
    values whatever the session says (``compat`` compares them on its own)."""
    try:
        canonical = str(plan.canonicalized().toString())
    except Exception:  # a plan Spark cannot canonicalize: no hash, so the judge always runs
        return None
    return _sha256([_UUID.sub("<uuid>", canonical)])


def _state_hash(plan) -> str | None:
    """A hash of the stateful operators of the canonical analyzed plan and of every node below them, filters
    left out (each node by its own arguments: a filter's removal changes no other node's canonical form)."""
    try:
        parts = []
        stack = [(plan.canonicalized(), False)]
        while stack:
            node, below = stack.pop()
            name = node.getClass().getSimpleName()
            below = below or (node.isStreaming() and _is_stateful(node, name))
            if below and name != "Filter":
                parts.append(_UUID.sub("<uuid>", str(node.simpleString(1_000_000))))
            children = node.children()
            stack.extend((children.apply(i), below) for i in reversed(range(children.size())))
    except Exception:  # a plan Spark cannot canonicalize: unknown
        return None
    return _sha256(parts)


_UDF_KINDS = ("UDF", "UDAF", "UDTF", "Aggregator")  # expression classes of user-defined functions end so


def _udfs(jvm, plan) -> tuple[UdfProfile, ...] | None:
    """The UDF calls of the analyzed plan with their code, in plan order; ``state`` as ``_state_hash`` decides
    (a stateful operator and every node below it except filters). None when the plan cannot be read."""
    try:
        out = []
        stack = [(plan, False)]
        while stack:
            node, below = stack.pop()
            name = node.getClass().getSimpleName()
            below = below or (node.isStreaming() and _is_stateful(node, name))
            expressions = node.expressions()
            for i in range(expressions.size()):
                for expression in _walk(expressions.apply(i)):
                    kind = str(expression.getClass().getSimpleName())
                    if kind.endswith(_UDF_KINDS):
                        out.append(UdfProfile(kind, _udf_name(expression), _udf_code(jvm, expression, kind),
                                              below and name != "Filter"))
            children = node.children()
            stack.extend((children.apply(i), below) for i in reversed(range(children.size())))
    except Exception:  # a plan this release does not know how to read: unknown, never a difference
        return None
    return tuple(out)


def _udf_name(expression) -> str:
    for getter in ("name", "udfName", "prettyName"):
        try:
            value = getattr(expression, getter)()
            if value is not None and hasattr(value, "isDefined"):  # ScalaUDF.udfName: Option[String]
                value = value.get() if value.isDefined() else None
            if value is not None:
                return str(value)
        except Exception:
            continue
    return "?"


def _udf_code(jvm, expression, kind: str) -> str | None:
    """The hash of a Python UDF's function (see ``UdfProfile``), None for any other UDF or when unreadable."""
    if not kind.startswith("Python"):
        return None
    try:
        command = bytes(expression.func().command().toArray(jvm.scala.reflect.ClassTag.Byte()))
        func = pickle.loads(command)  # what PySpark pickled in this process: (function, return type)
    except Exception:
        return None
    if isinstance(func, tuple) and func and callable(func[0]):
        return _sha256([_identity(part, set(), 0) for part in func])
    return None  # a command too large, sent as a broadcast: not the function itself


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _identity(value, seen: set, depth: int) -> str:
    """What ``value`` computes, without where its code lives (file, lines) or where it sits in memory."""
    if depth > 8 or id(value) in seen:
        return f"<{type(value).__qualname__}>"
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return repr(value)
    seen = seen | {id(value)}
    nested = functools.partial(_identity, seen=seen, depth=depth + 1)
    if isinstance(value, types.FunctionType):
        code = value.__code__
        closure = [nested(cell.cell_contents) if _filled(cell) else "<empty>" for cell in value.__closure__ or ()]
        globals_ = [f"{name}={nested(value.__globals__[name])}" for name in sorted(_global_names(code))
                    if name in value.__globals__]
        return "function(" + "; ".join([_code_identity(code), nested(value.__defaults__),
                                        nested(value.__kwdefaults__), *closure, *globals_]) + ")"
    if isinstance(value, types.CodeType):
        return _code_identity(value)
    if isinstance(value, types.MethodType):
        return f"method({nested(value.__func__)}; {nested(value.__self__)})"
    if isinstance(value, functools.partial):
        return f"partial({nested(value.func)}; {nested(value.args)}; {nested(value.keywords)})"
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, type):
        return f"class {value.__module__}.{value.__qualname__}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[" + ", ".join(nested(v) for v in value) + "]"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}{{" + ", ".join(sorted(nested(v) for v in value)) + "}"
    if isinstance(value, dict):
        return "dict{" + ", ".join(sorted(f"{nested(k)}: {nested(v)}" for k, v in value.items())) + "}"
    return f"{type(value).__module__}.{type(value).__qualname__} " + _ADDRESS.sub("", repr(value))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _code_identity(code: types.CodeType) -> str:
    consts = [_code_identity(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return "code(" + "; ".join([code.co_code.hex(), ",".join(consts), ",".join(code.co_names),
                                ",".join(code.co_varnames), ",".join(code.co_freevars), ",".join(code.co_cellvars),
                                str(code.co_argcount), str(code.co_posonlyargcount), str(code.co_kwonlyargcount),
                                str(code.co_flags)]) + ")"


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _sha256(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# ---- the profile recorded beside a checkpoint ------------------------------------------------------


def profile_path(fm: CheckpointFileManager, root: str) -> str:
    return join(ops_dir(fm, root), PROFILE_FILE)


_NEWEST = object()  # ``read_profile``'s default: the newest record, whatever batch the checkpoint is at
MAX_RECORDS = 50  # queries remembered beside a checkpoint (each change of its query is one)


def read_profile(fm: CheckpointFileManager, root: str, as_of: int | None | object = _NEWEST,
                 query_id: str | None | object = _NEWEST) -> ProfileRecord | None:
    """The recorded profile of the checkpoint at ``root``, or None if none was recorded (or there is no
    place beside it for one). ``as_of``: the checkpoint's last committed batch, to get the query that wrote it:
    the newest recorded before that batch ran (its ``batch`` below ``as_of``, or unknown). One recorded at that
    batch runs the batches after it: after a rollback to it, they are gone, and it did not write the state
    rolled back to (``record_profile`` keeps the queries before it). Only where none was recorded before, one
    recorded at that batch is the best known (accepted for it: a first record, or nothing committed since); one
    recorded after it is of batches a rollback removed, never the answer (None then). ``query_id``: the
    checkpoint's; a record of another (a checkpoint deleted, and another started at this place) is left out."""
    records = _records(fm, root)
    if query_id is not _NEWEST:
        records = [r for r in records if r.query_id is None or r.query_id == query_id]
    if not records:
        return None
    if as_of is _NEWEST or as_of is None:
        return records[0]
    before = next((r for r in records if r.batch is None or r.batch < as_of), None)
    return before or next((r for r in records if r.batch == as_of), None)


def _records(fm: CheckpointFileManager, root: str) -> list[ProfileRecord]:
    """Every record beside the checkpoint, newest first."""
    try:
        path = profile_path(fm, root)
    except BadInputError:  # a bucket root: no place beside it, so none recorded
        return []
    try:
        data = fm.read_bytes(path)
    except FileNotFoundError:
        return []
    except (StorageError, PermissionError) as e:  # refused, like an outage, is not "none recorded": that would drop
        # every record (``record_profile``) and pass a checkpoint whose state is gone (``restart``)
        raise StorageError(f"the recorded query profile could not be read: {problem_of(e)}",
                           path=fm.url(path), fix="give these credentials read and write access to the checkpoint-ops "
                           "files beside the checkpoint (.checkpoint-ops/), then run the same command again") from e
    except (IsADirectoryError, NotADirectoryError) as e:  # a thing in its place: damaged, as unparsable bytes are
        raise BadInputError(f"the recorded query profile is not a file ({type(e).__name__})", path=fm.url(path),
                            fix="remove what is there: the next accepted run records the query again") from None
    except OSError as e:  # a named pipe (refused by its type), a symlink loop, an I/O error: not "none recorded"
        raise StorageError(f"the recorded query profile could not be read: {e.strerror or e}", path=fm.url(path),
                           fix="check the storage and what is at that path (a file the next accepted run rewrites "
                           "may be removed), then run the same command again") from e
    try:
        doc = json.loads(data)
        if doc.get("format", 0) > PROFILE_FORMAT:
            return []  # written by a newer release: compare with Spark's files only
        return [_record(d) for d in [doc, *doc.get("earlier", [])]]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise BadInputError("the recorded query profile is not readable", path=fm.url(profile_path(fm, root)),
                            fix="delete it: the next accepted run records it again") from None


def _record(doc: dict) -> ProfileRecord:
    return ProfileRecord(QueryProfile.from_dict(doc["profile"]), doc["recorded_at"], bool(doc.get("judged")),
                         doc.get("batch"), doc.get("query_id"))


def checkpoint_query_id(fm: CheckpointFileManager, root: str) -> str | None:
    """The query id in the checkpoint's ``metadata`` (through a fence of ours), or None: no checkpoint yet, or one
    whose ``metadata`` cannot be read (fsck's to name)."""
    from .fence import is_fence, parse_fence

    try:
        data = fm.read_bytes(join(root, "metadata"))
        if is_fence(data):
            data = parse_fence(data).original_metadata
        doc = json.loads(data)
    except (OSError, ValueError):
        return None
    query_id = doc.get("id") if isinstance(doc, dict) else None
    return query_id if isinstance(query_id, str) else None


def record_profile(fm: CheckpointFileManager, root: str, profile: QueryProfile, judged: bool,
                   batch: int | None) -> ProfileRecord:
    """Record ``profile`` as the query accepted for the checkpoint at ``root``; ``batch`` is the checkpoint's last
    committed batch now (the query runs the batches after it). The queries recorded before it stay, newest first
    (at most ``MAX_RECORDS``), so that after a rollback ``read_profile(as_of=...)`` finds the query that wrote the
    batch rolled back to; those recorded at or after ``batch`` ran batches that are gone (rolled back), and are
    dropped. The same query as the newest one goes on: that record stays, from the batch it started at."""
    try:
        earlier = _records(fm, root)
    except StorageError:
        raise  # refused: never replaced unread
    except BadInputError:
        earlier = []  # unreadable: replaced (the error's own fix)
    query_id = checkpoint_query_id(fm, root)
    earlier = [] if batch is None else [r for r in earlier if (r.batch is None or r.batch < batch) and (
        r.query_id is None or query_id is None or r.query_id == query_id)]  # another id: another checkpoint's
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if earlier and earlier[0].profile.to_dict() == profile.to_dict():
        first = earlier[0]
        record = ProfileRecord(profile, now, judged or first.judged, first.batch, query_id or first.query_id)
        earlier = earlier[1:]
    else:
        record = ProfileRecord(profile, now, judged, batch, query_id)
    doc = {**record.to_dict(), "earlier": [r.to_dict() for r in earlier[: MAX_RECORDS - 1]]}
    fm.write_bytes(profile_path(fm, root), json.dumps(doc, sort_keys=True).encode(), overwrite=True)
    return record
