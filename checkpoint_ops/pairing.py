"""Does a file sink belong to a checkpoint? Its pairing: recorded on both sides, else judged from history.

Nothing in a checkpoint names the output its file sink writes, and nothing in ``_spark_metadata`` names
the checkpoint. A ``--sink`` that is another query's output would have its log cut and its data deleted
by a rollback, so every operation that takes a checkpoint and its sinks together asks here first.

**Records.** Once a pairing is known it is recorded on both sides, naming the checkpoint (its URL and the
query id in its ``metadata``): in the checkpoint's batch ledger (``ledger/pairing/``) and in a hidden file
beside the sink log, ``<output>/.checkpoint-ops.pairing.json`` (hidden: Spark's readers and Spark's file
index never read it). ``ledger sync`` and ``backup create`` record it; ``backup restore`` records the
targets, relocated. A record on either side decides:

* the output's record names this checkpoint (same location and query id): paired;
* it names another checkpoint, or this location under another query id (the checkpoint was deleted and
  started again: its new query would find the old sink log and skip those batch ids): refused, always;
* the checkpoint's ledger records this output: paired; it records only other outputs: refused (a query
  writes one file sink, and Spark does not let it move).

A record that names another output is one copied along with its directory: it says nothing here.

**Without a record, the batch histories must line up.** Spark writes batch N in this order (reference
§2.5, §4.3, §7): it plans the batch (``batchTimestampMs`` in ``offsets/N``), the sink writes its data
files and then ``_spark_metadata/N`` (each entry keeps its file's ``modificationTime``), then
``commits/N``; batch N+1 is planned only after that. So every file the sink log attributes to batch N
(a plain log file holds exactly one batch's entries) was written while the checkpoint ran batch N::

    batchTimestampMs(N) - slack  <=  modificationTime  <=  batchTimestampMs(N+1) + slack

(``commits/N``'s own modification time bounds it when ``offsets/N+1`` is not there; 2 s of slack for object
stores that keep times to the second and for the driver's clock against the storage's). Both sides keep
these times in file *contents*, so copies keep them. The newest (up to 10) batches both describe, with at
least one file, are compared, and the pair lines up when most of them do: one odd batch (a timestamp edited
by hand, damage) does not decide. States a rollback exists to repair still line up: a sink **ahead** of the
checkpoint (its extra batches have no offsets to compare), a sink **behind** it (the batches it lacks are
not compared). Another query's output, which ran its batches at other times, does not. With no batch to
compare (the sink's plain log files and the checkpoint's offsets do not overlap) nothing is proven.

**Blind spot:** two queries with identical batch histories (same batch ids, run at the same moments, e.g.
started together on one trigger) and no record line up with each other's outputs. The first ``ledger
sync`` (the Dagster asset runs one after every run) or ``backup create`` of each query records the right
pairs, and records always win.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from .errors import BadInputError, RefusedError, StorageError, StoreUnavailableError, problem_of
from .fence import is_fence, parse_fence
from .journal import utc_stamp
from .ledger import Ledger, PairingRecord
from .model.checkpoint import Checkpoint
from .model.logfile import LogFormatError
from .model.sink import SinkOutput
from .storage import open_file_manager
from .storage.paths import join, place_key

PAIRING_FILE = ".checkpoint-ops.pairing.json"
MAX_COMPARED = 10  # newest batches both sides describe that are compared
CLOCK_SLACK_MS = 2000

PAIRED = "paired"  # a record on either side names this pair
LINED_UP = "lined-up"  # no record; the batch histories line up
NOT_LINED_UP = "not-lined-up"  # no record; the batch histories do not line up
UNPROVEN = "unproven"  # no record and no batch both sides describe
SINK_ELSEWHERE = "sink-paired-elsewhere"  # the output's record names another checkpoint
CHECKPOINT_ELSEWHERE = "checkpoint-paired-elsewhere"  # the checkpoint's ledger records only other outputs


@dataclass(frozen=True)
class BatchLineUp:
    """One batch both sides describe: when the checkpoint ran it, and when the sink's files were written."""

    batch: int
    planned_ms: int  # batchTimestampMs of offsets/N
    until_ms: int | None  # batchTimestampMs of offsets/N+1, else commits/N's modification time; None: open
    files_from_ms: int  # the oldest and newest modificationTime of the files the sink log gives the batch
    files_to_ms: int

    @property
    def lines_up(self) -> bool:
        if self.files_from_ms < self.planned_ms - CLOCK_SLACK_MS:
            return False
        return self.until_ms is None or self.files_to_ms <= self.until_ms + CLOCK_SLACK_MS

    def describe(self) -> str:
        until = _iso(self.until_ms) if self.until_ms is not None else "(open)"
        files = _iso(self.files_from_ms) + ("" if self.files_to_ms == self.files_from_ms else
                                            f"..{_iso(self.files_to_ms)}")
        return f"batch {self.batch}: files written {files}, the checkpoint ran it {_iso(self.planned_ms)}..{until}"

    def to_dict(self) -> dict:
        return {"batch": self.batch, "planned_ms": self.planned_ms, "until_ms": self.until_ms,
                "files_from_ms": self.files_from_ms, "files_to_ms": self.files_to_ms, "lines_up": self.lines_up}


@dataclass(frozen=True)
class PairingVerdict:
    """Whether one sink output belongs to one checkpoint, and why."""

    checkpoint: str
    sink: str
    status: str  # PAIRED | LINED_UP | NOT_LINED_UP | UNPROVEN | SINK_ELSEWHERE | CHECKPOINT_ELSEWHERE
    recorded: tuple[str, ...]  # the sides holding a record of this pair: "ledger", "sink"
    evidence: str
    other: str | None = None  # what a record names instead: another checkpoint, or the outputs it writes
    compared: tuple[BatchLineUp, ...] = ()  # the batches compared when no record decided

    @property
    def ok(self) -> bool:
        return self.status in (PAIRED, LINED_UP)

    def to_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "sink": self.sink, "status": self.status, "ok": self.ok,
                "recorded": list(self.recorded), "evidence": self.evidence, "other": self.other,
                "compared": [c.to_dict() for c in self.compared]}

    @property
    def problem(self) -> str:
        if self.status == UNPROVEN:
            return f"cannot tell whether {self.sink} is the output of the query of checkpoint {self.checkpoint}: " \
                   f"{self.evidence}"
        return f"{self.sink} is not the output of the query of checkpoint {self.checkpoint}: {self.evidence}"

    @property
    def fix(self) -> str:
        ck, out = self.checkpoint, self.sink
        assume = f"`checkpoint-ops ledger sync {ck} --sink {out} --assume-paired`"
        if self.status == SINK_ELSEWHERE:
            return (f"pass the output this checkpoint's query writes. If the record is stale (that checkpoint no "
                    f"longer writes {out}), move {join(out, PAIRING_FILE)} away; the pairing is then judged again")
        if self.status == CHECKPOINT_ELSEWHERE:
            return (f"pass the output this checkpoint's query writes ({self.other}). If {out} really is its output "
                    f"as well, record that with {assume}")
        if self.status == NOT_LINED_UP:
            return (f"pass the output this checkpoint's query writes. If {out} really is its output (batches re-run "
                    "after a rollback made by hand, or clocks more than 2 s apart, hide it), record the pairing with "
                    f"{assume}")
        if self.status == UNPROVEN:
            return (f"pass the output this checkpoint's query writes. If {out} is its output, `checkpoint-ops ledger "
                    f"sync {ck} --sink {out}` records the pairing once both sides describe a common batch; if you are "
                    f"sure now, record it with {assume}")
        return ""


def timing_alone_warning(verdict: PairingVerdict) -> str:
    """The plan's warning for a sink paired by batch timing alone (``LINED_UP``): the blind spot (module docstring)."""
    return (f"{verdict.sink} is taken for the output of this checkpoint's query from batch timing alone (no record on "
            "either side): another query that ran its batches at the same moments (started together, on one "
            "trigger, from the same source) lines up as well, and a rollback of its output loses rows that query "
            f"never writes again. Go ahead only if {verdict.sink} is the output this query writes; `checkpoint-ops "
            f"ledger sync {verdict.checkpoint} --sink {verdict.sink}` records the pairing")


class PairingRefused(RefusedError):
    """A sink given with a checkpoint is not (or not provably) its query's output: exit 1, nothing changed.

    A refusal, not unusable input: each path on its own is a readable checkpoint and output; what is
    refused is operating on them together, judged from records or from the batch history (a judgement
    with a documented blind spot), like the other safety refusals, and as ``fsck`` reports it
    (``sink-not-paired``, exit 1)."""

    def __init__(self, verdict: PairingVerdict):
        self.verdict = verdict
        super().__init__(verdict.problem, path=verdict.sink, fix=verdict.fix)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "pairing": self.verdict.to_dict()}


# ---- the records ------------------------------------------------------------------------------------


def sink_record(sink: SinkOutput) -> PairingRecord | None:
    """The pairing record beside the sink log, or None. One read, unless the output's listing already
    shows there is none (and none was written since: a pass's ledger sync writes it after the listing)."""
    if sink.data_listed and PAIRING_FILE not in sink.listing and not sink.pairing_written:
        return None
    path = join(sink.root, PAIRING_FILE)
    try:
        data = sink.fm.read_bytes(path)
    except FileNotFoundError:
        return None
    return PairingRecord.parse(data, sink.fm.url(path))


def _write_sink_record(sink: SinkOutput, record: PairingRecord, replace: bool) -> None:
    sink.fm.write_bytes(join(sink.root, PAIRING_FILE), record.to_bytes(), overwrite=replace)
    sink.pairing_written = True


def same_location(a: str, b: str) -> bool:
    """Two URLs name the same place (``s3a://`` and ``s3://``, a path and its ``file://`` URL; on local disk,
    two spellings of one directory through symbolic links)."""
    return a == b or place_key(a) == place_key(b)


def refuse_repeated(urls: list[str], flag: str = "--sink") -> None:
    """BadInputError (exit 2, nothing read or changed) when two of ``urls`` name one place, however spelled (a
    symbolic link, ``//``, ``s3a://``): an operation would plan the same output twice, one plan blind to the other's
    moves (a rollback then deletes files it keeps, and its undo finds them in the other's trash)."""
    seen: dict[str, str] = {}
    for url in urls:
        place = place_key(url).rstrip("/")
        if place in seen:
            first = seen[place]
            again = "is given twice" if first == url else f"is the same place as {flag} {first}"
            raise BadInputError(f"{flag} {url} {again}: each output is given once", path=url,
                                fix=f"give each file sink's output directory once (one {flag} per output)")
        seen[place] = url


def _same_query(a: str | None, b: str | None) -> bool:
    return a is None or b is None or a == b


def query_id_of(ckpt: Checkpoint) -> str | None:
    try:
        return ckpt.query_id
    except LogFormatError:
        return None  # unreadable metadata: fsck and the restart set say so


def ledger_records(ckpt: Checkpoint, ledger: Ledger | None) -> list[PairingRecord]:
    """The ledger's pairing records about this checkpoint (not those of a ledger copied from elsewhere,
    nor of an earlier query at this location)."""
    if ledger is None:
        return []
    qid = query_id_of(ckpt)
    return [r for r in ledger.pairings if same_location(r.checkpoint, ckpt.url) and _same_query(r.query_id, qid)]


# ---- judging ------------------------------------------------------------------------------------------


def check_pairing(ckpt: Checkpoint, sinks: list[SinkOutput], ledger: Ledger | None = None, *,
                  complete: bool = False) -> list[PairingVerdict]:
    """One verdict per sink, in order (module docstring). Read-only. The ledger is read only when an
    output's own record does not decide, unless ``complete`` (then ``recorded`` names both sides when both
    hold a record; otherwise a verdict from the output's record alone says ``recorded: ["sink"]``)."""
    qid = query_id_of(ckpt)
    recorded: list[str] | None = None

    def recorded_sinks() -> list[str]:
        nonlocal recorded
        if recorded is None:
            recorded = [s for r in ledger_records(ckpt, ledger) for s in r.sinks]
        return recorded

    return [_verdict(ckpt, qid, sink, ledger, recorded_sinks, complete) for sink in sinks]


def require_pairing(ckpt: Checkpoint, sinks: list[SinkOutput], ledger: Ledger | None = None) -> list[PairingVerdict]:
    """``check_pairing``, raising PairingRefused (exit 1) for the first sink that is not paired."""
    verdicts = check_pairing(ckpt, sinks, ledger)
    for v in verdicts:
        if not v.ok:
            raise PairingRefused(v)
    return verdicts


def _verdict(ckpt: Checkpoint, qid: str | None, sink: SinkOutput, ledger: Ledger | None, recorded_sinks,
             complete: bool) -> PairingVerdict:
    rec = sink_record(sink)
    where = join(sink.url, PAIRING_FILE)
    copied = ""
    if rec is not None and any(same_location(s, sink.url) for s in rec.sinks):
        if same_location(rec.checkpoint, ckpt.url) and _same_query(rec.query_id, qid):
            both = complete and any(same_location(s, sink.url) for s in recorded_sinks())
            return PairingVerdict(ckpt.url, sink.url, PAIRED, ("ledger", "sink") if both else ("sink",),
                                  f"recorded in {where}" + (" and in the checkpoint's batch ledger" if both else ""))
        if same_location(rec.checkpoint, ckpt.url):
            why = (f"{where} records it as the output of the query {rec.query_id} at this location, but the "
                   f"checkpoint's query id is now {qid}: the checkpoint was started again from scratch, and its new "
                   "query would silently skip the batch ids the old one logged there")
        else:
            why = f"{where} records it as the output of checkpoint {rec.checkpoint} (query {rec.query_id})"
        return PairingVerdict(ckpt.url, sink.url, SINK_ELSEWHERE, (), why,
                              other=f"{rec.checkpoint} (query {rec.query_id})")
    if rec is not None:
        copied = f" ({where} was copied from {', '.join(rec.sinks)} and says nothing about this output)"
    others = recorded_sinks()
    if any(same_location(s, sink.url) for s in others):
        return PairingVerdict(ckpt.url, sink.url, PAIRED, ("ledger",), "recorded in the checkpoint's batch ledger"
                              + copied)
    if others:
        named = ", ".join(sorted(set(others)))
        return PairingVerdict(ckpt.url, sink.url, CHECKPOINT_ELSEWHERE, (),
                              f"the checkpoint's batch ledger records that its query writes {named} (a query "
                              "writes one file sink)" + copied, other=named)
    status, evidence, compared = _line_up(ckpt, sink, ledger)
    return PairingVerdict(ckpt.url, sink.url, status, (), evidence + copied, compared=compared)


def _line_up(ckpt: Checkpoint, sink: SinkOutput, ledger: Ledger | None) -> tuple[str, str, tuple[BatchLineUp, ...]]:
    log = sink.log
    plain = sorted((b for b, f in log.files.items() if not f.compact), reverse=True)

    def described(b: int) -> bool:
        return b in ckpt.offset_files or (ledger is not None and ledger.has("offsets", b))

    candidates = [b for b in plain if described(b)][: 3 * MAX_COMPARED]
    log.prefetch(candidates)
    ckpt.load_offsets(sorted({x for b in candidates for x in (b, b + 1)}), errors=[])  # one concurrent read
    compared: list[BatchLineUp] = []
    for b in candidates:
        if len(compared) == MAX_COMPARED:
            break
        planned = _planned_ms(ckpt, ledger, b)
        if planned is None:
            continue
        try:
            times = [int(e.doc["modificationTime"]) for e in log.read([b])[b]
                     if isinstance(e.doc.get("modificationTime"), int)]
        except LogFormatError:
            continue  # damage is fsck's and the restart set's business
        if not times:
            continue
        compared.append(BatchLineUp(b, planned, _until_ms(ckpt, ledger, b), min(times), max(times)))
    compared.reverse()
    if not compared:
        sink_span = f"{min(plain)}..{max(plain)}" if plain else "none"
        ck = sorted(ckpt.offset_files)
        ck_span = f"{ck[0]}..{ck[-1]}" if ck else "none"
        return UNPROVEN, (f"no record on either side, and no batch both describe with files to compare (the sink "
                          f"log's plain files hold batches {sink_span}, the checkpoint's offsets {ck_span})"), ()
    good = [c for c in compared if c.lines_up]
    # the batches compared need not be contiguous (a batch with no file to compare is skipped)
    batches = (f"between {compared[0].batch} and {compared[-1].batch}" if len(compared) > 1
               else str(compared[0].batch))
    if 2 * len(good) > len(compared):
        odd = [c for c in compared if not c.lines_up]
        return LINED_UP, (f"no record on either side; their batch histories line up: the files the sink log gives "
                          f"{len(good)} of the {len(compared)} batches compared ({batches}) were written while the checkpoint "
                          "ran those batches"
                          + (f" (not: {odd[0].describe()})" if odd else "")), tuple(compared)
    bad = [c for c in compared if not c.lines_up]
    return NOT_LINED_UP, (f"no record on either side, and their batch histories do not line up: of the {len(compared)} batches compared ({batches}), "
                          f"{len(bad)} wrote their files when the checkpoint was not running them, e.g. "
                          f"{bad[-1].describe()}"), tuple(compared)


def _planned_ms(ckpt: Checkpoint, ledger: Ledger | None, b: int) -> int | None:
    if b in ckpt.offset_files:
        o = ckpt.load_offsets([b], errors=[]).get(b)
        if o is not None:
            return o.timestamp_ms
    if ledger is not None and ledger.has("offsets", b):
        return ledger.records[b].get("timestamp_ms")
    return None


def _until_ms(ckpt: Checkpoint, ledger: Ledger | None, b: int) -> int | None:
    nxt = _planned_ms(ckpt, ledger, b + 1)
    if nxt is not None:
        return nxt
    f = ckpt.commit_files.get(b)
    if f is not None and f.info.mtime is not None:
        return int(f.info.mtime * 1000)
    return None


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---- recording -----------------------------------------------------------------------------------------


def record_pairing(ckpt: Checkpoint, sinks: list[SinkOutput], ledger: Ledger | None, *, by: str = "ledger sync",
                   assume_paired: bool = False) -> list[PairingVerdict]:
    """Check, then record every pair not yet recorded on both sides, in the ledger and beside the sink log.

    Raises PairingRefused before writing anything when a sink's record names another checkpoint (always),
    or when a sink does not line up or the ledger pairs the checkpoint with other outputs (unless
    ``assume_paired``: the user says so explicitly; a mismatch is never recorded on its own). A pair no
    batch can prove (``unproven``) is left unrecorded unless ``assume_paired``. Nothing is recorded while
    the checkpoint's query id cannot be read. Returns the verdicts, as recorded."""
    verdicts = check_pairing(ckpt, sinks, ledger)
    assumable = (NOT_LINED_UP, UNPROVEN, CHECKPOINT_ELSEWHERE)
    for v in verdicts:
        if v.status == SINK_ELSEWHERE or (v.status in (NOT_LINED_UP, CHECKPOINT_ELSEWHERE) and not assume_paired):
            raise PairingRefused(v)
    qid = query_id_of(ckpt)
    if qid is None:
        return verdicts
    todo = [i for i, v in enumerate(verdicts) if v.ok or (assume_paired and v.status in assumable)]
    stamp, who = utc_stamp(), by + (" --assume-paired" if assume_paired else "")
    in_ledger = [s for r in ledger_records(ckpt, ledger) for s in r.sinks]
    missing = tuple(sinks[i].url for i in todo if not any(same_location(s, sinks[i].url) for s in in_ledger))
    if missing and ledger is not None:
        ledger.record_pairing(PairingRecord(ckpt.url, qid, missing, stamp, who))
    out = list(verdicts)
    for i in todo:
        sink, v = sinks[i], verdicts[i]
        if "sink" not in v.recorded:
            existing = sink_record(sink)  # a record copied from elsewhere is replaced
            try:
                _write_sink_record(sink, PairingRecord(ckpt.url, qid, (sink.url,), stamp, who),
                                   replace=existing is not None)
            except FileExistsError:  # recorded meanwhile by someone else: it must agree
                again = check_pairing(ckpt, [sink], ledger)[0]
                if not again.ok:
                    raise PairingRefused(again) from None
        sides = ("ledger", "sink") if ledger is not None else ("sink",)
        out[i] = PairingVerdict(ckpt.url, sink.url, PAIRED, sides,
                                v.evidence if v.status == PAIRED else f"recorded now ({who}); {v.evidence}",
                                compared=v.compared)
    return out


def record_pairing_after(ckpt: Checkpoint, sinks: list[SinkOutput], ledger: Ledger | None, *, operation: str,
                         op_id: str, anchor_url: str) -> list[PairingVerdict]:
    """``record_pairing`` once a journaled operation (``operation`` ``op_id``, anchored at ``anchor_url``) was
    applied: a store that fails now stops it as any store failure does (exit 2), saying that the operation
    was applied and only the pairing record was not written, and how to write it (never "nothing was
    changed": the operation's history says it was)."""
    try:
        return record_pairing(ckpt, sinks, ledger, by=f"{operation} {op_id}")
    except StoreUnavailableError as e:
        outputs = " ".join(f"--sink {s.url}" for s in sinks)
        raise e.finish_with(f"the {operation} {op_id} was applied (`checkpoint-ops history {anchor_url}` shows it); "
                            "only the record that pairs the checkpoint with its sink output was not written. Once "
                            f"the store answers, write it with `checkpoint-ops ledger sync {ckpt.url} {outputs}` "
                            "(the same command again finds nothing left to do and writes nothing); do not undo "
                            "for this") from e.__cause__


def paired_checkpoint_url(sink: SinkOutput, storage_options: dict | None = None) -> str | None:
    """The location of the checkpoint the output's pairing record names, if its ``metadata`` is there with the
    same query id: two reads (the record, ``metadata``), no listing of the checkpoint. None when there is no
    such record, or the checkpoint is gone or its metadata is not a query's. A store that refuses the read (access
    denied, misconfigured for it) is a ``StorageError`` and one that kept failing a ``StoreUnavailableError``:
    neither says there is no such checkpoint, and a refusal that needs it (``sink compact`` without it) stops."""
    rec = sink_record(sink)
    if rec is None or not any(same_location(s, sink.url) for s in rec.sinks):
        return None
    where = join(rec.checkpoint, "metadata")
    try:
        fm, root = open_file_manager(rec.checkpoint, storage_options)
        where = fm.url(join(root, "metadata"))
        raw = fm.read_bytes(join(root, "metadata"))
        if is_fence(raw):  # an operation of ours is under way there: the query's own metadata is in the fence
            raw = parse_fence(raw).original_metadata
        query_id = json.loads(raw).get("id")
    except (FileNotFoundError, NotADirectoryError, ValueError, AttributeError):
        return None
    except (StorageError, OSError) as e:
        record = sink.fm.url(join(sink.root, PAIRING_FILE))
        raise StorageError(f"the checkpoint this output's pairing record ({record}) names cannot be read: "
                           f"{problem_of(e)}", path=where,
                           fix="run it with credentials (--storage-options, or the environment) that can read both "
                               "this output and that checkpoint, which may be its checkpoint (a 403 may also mean it is "
                               "gone and these credentials may not list its bucket); if someone with access confirms "
                               f"(`checkpoint-ops inspect {rec.checkpoint}`) that it no longer writes this output, move "
                               f"{record} away") from None
    except BadInputError:  # a fence that is not one: its own commands name it
        return None
    return rec.checkpoint if _same_query(rec.query_id, query_id) else None


def paired_checkpoint(sink: SinkOutput, storage_options: dict | None = None) -> Checkpoint | None:
    """The checkpoint the output's pairing record names, if it is still there with the same query id
    (``paired_checkpoint_url``), opened."""
    url = paired_checkpoint_url(sink, storage_options)
    if url is None:
        return None
    fm, root = open_file_manager(url, storage_options)
    ckpt = Checkpoint(fm, root)
    try:
        ckpt.require_checkpoint(url)
    except BadInputError:
        if ckpt.listing.unreadable_dirs.get("") is not None:  # refused, not gone: what needs it cannot be judged
            raise
        return None
    return ckpt if ckpt.kind == "structured" else None
