"""Restoring a backup into an empty place, relocated, and optionally rolled back to an earlier batch.

The restore is one plan applied by the executor, anchored at the target checkpoint: its ``metadata``
is the fence until every other file is written, then the backed-up ``metadata`` replaces it, so Spark
cannot start on half a checkpoint; an interrupted restore resumes (``checkpoint-ops resume TARGET``) or
undoes (``checkpoint-ops undo TARGET``, which leaves the target empty again).

A sink target is never a partial table to Spark's readers either: each sink's log (``_spark_metadata``) is
written before anything else (phase ``sink-log-write``), then its data files. Spark reads a sink output
through its log when one exists, and fails on a listed file that is missing; without one it lists the
directory, so data files written first would be read as the whole table. Every prefix of the restore is
thus read as nothing (no log yet, no data), or fails (a log whose batches or files are not all there yet),
or is the full table; the undo removes the files in the reverse order (data before the log). Every object is read and
checked against its hash before anything is written, and again as it is written.

Relocation: file-source logs, sink logs and the batch ledger hold absolute paths (reference §7), and so
does transformWithState's operator metadata v2 (the state schema files Spark reads on restart). The
backup's own checkpoint and sink locations map to the targets; ``--relocate OLD=NEW`` maps more (the
input directory, say). A sink log entry must end up inside its sink target, or the restore is refused.

``to_batch``: the rollback planner runs on the backup itself (a read-only view), so the restart set of
that batch is validated and the rolled-back file set is known before anything is written; the restore
then writes exactly that set.

Targets never overlap: a sink target equal to, inside or around the checkpoint target (or another sink
target) is unusable input (exit 2), refused before anything is read or written. So is a target whose batch
ledger (``.checkpoint-ops/<name>/ledger`` beside it) holds anything: the record of another checkpoint that
was there (removed by hand, which leaves the hidden directory), which the restore would merge with its own. The restored checkpoint
and sinks are recorded as paired (``pairing.py``), at their new locations.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Callable

from ..errors import BadInputError, CheckpointOpsError, RefusedError, StoreUnavailableError, param
from ..executor import Anchor, AppliedOperation, JournalHooks, apply_plan
from ..fence import is_fence, parse_fence, recovery_advice
from ..journal import ops_dir, utc_stamp
from ..lease import is_lease_file, read_lease
from ..ledger import PAIRING_DIR, Ledger, PairingRecord
from ..model.checkpoint import Checkpoint
from ..model.sink import SINK_LOG_DIR, SinkOutput
from ..operation import ApplyContext, Operation, Site
from ..pairing import PAIRING_FILE
from ..plan import Plan
from ..rollback import plan_rollback
from ..storage import open_file_manager
from ..units import iso_ms
from ..storage.paths import (
    Location,
    hadoop_path,
    hadoop_path_to_location,
    how_places_overlap,
    join,
    parse_url,
    spark_url_to_location,
    uri_path,
)
from .claims import HeldClaim
from .create import wait_for_prune
from .repository import Manifest, Repository
from .view import BackupView

_SOURCE_LOG = re.compile(r"^sources/[^/]+/\d+(\.compact)?$")
_SINK_LOG = re.compile(r"^_spark_metadata/\d+(\.compact)?$")
_OPERATOR_METADATA_V2 = re.compile(r"^state/\d+/_metadata/v2/\d+$")


@dataclass(frozen=True)
class Rule:
    """Paths under ``old`` move under ``new`` (both parsed locations)."""

    old: Location
    new: Location

    def apply(self, loc: Location) -> Location | None:
        if loc.scheme != self.old.scheme:
            return None
        if loc.path == self.old.path or loc.path.startswith(self.old.path.rstrip("/") + "/"):
            return Location(self.new.scheme, self.new.path.rstrip("/") + loc.path[len(self.old.path.rstrip("/")):],
                            self.new.original_scheme)
        return None


def spark_url(loc: Location) -> str:
    """A location as Spark writes paths into its logs: qualified, URL-encoded."""
    if loc.is_local:
        return "file://" + uri_path(loc.path)
    bucket, _, key = loc.path.partition("/")
    scheme = {"s3": "s3a"}.get(loc.original_scheme or loc.scheme, loc.original_scheme or loc.scheme)
    return f"{scheme}://{bucket}/{uri_path(key)}"


def _absolute(part: str) -> bool:
    return bool(part) and (part.startswith("/") or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", part) is not None)


def split_relocation(text: str) -> tuple[str, str]:
    """``OLD=NEW`` where either side may itself hold ``=`` (Hive-style ``date=2026-11-21``): the split is
    the one ``=`` after which an absolute path or URL starts and before which one ends."""
    splits = [(text[:i], text[i + 1:]) for i, ch in enumerate(text) if ch == "="]
    valid = [(old, new) for old, new in splits if _absolute(old) and _absolute(new)]
    fix = ("e.g. --relocate /data/in=/mnt/restore/in (Hive-style names like date=2026-11-21 inside either path are "
           "fine)")
    if not valid:
        old, sep, new = text.partition("=")
        bad = old if not _absolute(old) else new
        raise BadInputError(f"--relocate {text!r} is not OLD=NEW: {bad!r} is not an absolute path or URL" if sep
                            else f"--relocate {text!r} is not OLD=NEW", fix=fix)
    if len(valid) > 1:
        raise BadInputError(f"--relocate {text!r} can be read as OLD=NEW in more than one way", fix=fix)
    return valid[0]


def parse_rules(relocate: list[str]) -> list[Rule]:
    rules = []
    for text in relocate:
        old, new = split_relocation(text)
        for part in (old, new):
            if "/../" in f"/{part}/":
                raise BadInputError(f"--relocate {text!r}: {part!r} is not an absolute path or URL without '..'")
        rules.append(Rule(parse_url(old), parse_url(new)))
    return rules


@dataclass
class RestorePlan:
    plan: Plan
    manifest: Manifest
    metadata: bytes | None  # what the target's metadata becomes (the fence stands in until then)
    anchor: Anchor
    fms: dict
    objects: set[str]  # every object the restore reads
    staged: list[tuple] = None


INPUT_SAMPLE = 200  # relocated file-source entries whose input files' times a restore checks (``_Restore``)


class _Restore:
    def __init__(self, repo: Repository, m: Manifest, target_url: str, sink_targets: list[str], relocate: list[str],
                 storage_options: dict | None, stage: bool):
        self.repo, self.m, self.stage = repo, m, stage
        self.so = storage_options
        self.sinks = sorted((r for r in m.roots if r.startswith("sink")), key=lambda r: int(r[4:]))
        self.t_fm, self.t_root = open_file_manager(target_url, storage_options)
        self.target_url = self.t_fm.url(self.t_root)
        opened = [open_file_manager(url, storage_options) for url in sink_targets]
        refuse_overlapping([("the checkpoint target", self.t_fm, self.t_root)]
                           + [(f"{param('sink_target')} {url}", fm, root) for url, (fm, root) in zip(sink_targets, opened)])
        if len(sink_targets) != len(self.sinks):
            raise BadInputError(f"the backup holds {len(self.sinks)} file sink(s) "
                                f"({', '.join(m.roots[r]['url'] for r in self.sinks) or 'none'}); give one "
                                f"target for each, in that order ({param('sink_target')}; got {len(sink_targets)})",
                                path=m.url,
                                fix=(f"give {param('sink_target')} EMPTY_DIR once for each, in that order: the "
                                     "restored query writes on into each restored output (its sink log and data "
                                     "as of the backup)" if self.sinks else
                                     f"drop {param('sink_target')}: the backup holds no file sink"))
        _require_empty(self.t_fm, self.t_root, target_url)
        self.sink_fms = {}
        for rid, url, (fm, root) in zip(self.sinks, sink_targets, opened):
            _require_empty(fm, root, url)
            self.sink_fms[rid] = (fm, root)
        self.ledger_path = join(ops_dir(self.t_fm, self.t_root), "ledger")
        _require_no_ledger(self.t_fm, self.ledger_path, self.target_url)
        # the backup's own locations go to the targets; the user's rules come first (more specific)
        self.relocate = list(relocate)
        self.rules = parse_rules(relocate) + [Rule(parse_url(m.roots["checkpoint"]["url"]), parse_url(self.target_url))]
        self.applied: set[int] = set()  # the user's rules (by index) that moved a path
        self.unmoved: dict[str, None] = {}  # folders of paths no rule moved (for a rule that matched nothing)
        self.sink_rules = {rid: Rule(parse_url(m.roots[rid]["url"]), parse_url(fm.url(root)))
                           for rid, (fm, root) in self.sink_fms.items()}
        self.rules += list(self.sink_rules.values())
        self.objects: set[str] = set()
        self.staged: list[tuple] = []
        self.moved_inputs: list[tuple[str, int]] = []  # (relocated path, logged time ms) of file-source entries

    # -- relocating the paths inside logs -------------------------------------------------------------
    def _relocate(self, loc: Location) -> Location | None:
        """Where the first rule that applies moves ``loc`` (None if none does)."""
        for i, rule in enumerate(self.rules):
            new = rule.apply(loc)
            if new is not None:
                self.applied.add(i)
                return new
        if len(self.unmoved) < 5:
            self.unmoved[loc.path.rpartition("/")[0] or "/"] = None
        return None

    def _require_rules_used(self) -> None:
        """A ``--relocate`` rule that moved no path is a typing slip (OLD is not where the backup's paths are):
        restored without it, the logs keep the old paths and Spark fails there or reads the old place."""
        for i, text in enumerate(self.relocate):
            if i not in self.applied:
                where = ", ".join(self.unmoved) if self.unmoved else "none: every path lies in the checkpoint or a sink"
                raise BadInputError(
                    f"--relocate {text!r} matches no path the backup's logs, ledger or schema files name: nothing of "
                    f"backup {self.m.id} lies under {self.rules[i].old.path}", path=self.m.url,
                    fix=f"correct OLD, or drop the rule; the paths outside the checkpoint and its sinks are under: {where} "
                        "(nothing was changed)")

    def _move(self, path: str) -> str | None:
        new = self._relocate(spark_url_to_location(path))
        return None if new is None else spark_url(new)

    def _line(self, line: bytes, rid: str, rel: str) -> bytes:
        try:
            doc = json.loads(line)
        except ValueError:
            return line  # not an entry (e.g. Kafka's initial offsets): left as it is
        if not isinstance(doc, dict) or not isinstance(doc.get("path"), str):
            return line
        new = self._move(doc["path"])
        if new is not None and rid == "checkpoint" and len(self.moved_inputs) < INPUT_SAMPLE \
                and isinstance(doc.get("timestamp"), int):
            self.moved_inputs.append((new, doc["timestamp"]))  # a file-source entry: its time is checked
        if rid in self.sink_rules:  # a sink entry must stay in its sink target
            target = self.sink_rules[rid].new
            final = spark_url_to_location(new or doc["path"])
            if not (final.scheme == target.scheme and (final.path == target.path or
                                                       final.path.startswith(target.path.rstrip("/") + "/"))):
                raise BadInputError(f"{rel} lists {doc['path']}, which would point outside the sink target "
                                    f"{target.path} after relocation", path=self.m.url,
                                    fix="drop or change the --relocate rule that moves it elsewhere")
        if new is None:
            return line
        doc["path"] = new
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()

    def _move_hadoop_path(self, path: str) -> str | None:
        """A path as Hadoop's ``Path.toString`` writes it, relocated (None if no rule moves it)."""
        new = self._relocate(hadoop_path_to_location(path))
        return None if new is None else hadoop_path(new)

    def _operator_metadata(self, content: bytes) -> bytes:
        """Operator metadata v2 names its state schema files by absolute path, and Spark reads them there
        when the query restarts: point them at the target. Only those strings change."""
        doc = json.loads(content.partition(b"\n")[2])
        out = content
        for store in doc.get("stateStoreInfo") or []:
            paths = store.get("stateSchemaFilePaths") or ([store["stateSchemaFilePath"]]
                                                          if store.get("stateSchemaFilePath") else [])
            for path in paths:
                new = self._move_hadoop_path(path)
                if new is not None and new != path:
                    old_json = json.dumps(path, ensure_ascii=False).encode()
                    out = out.replace(old_json, json.dumps(new, ensure_ascii=False).encode())
        return out

    def _ledger_line(self, line: bytes) -> bytes:
        rec = json.loads(line)
        sinks = rec.get("sinks")
        if not sinks:
            return line
        moved = {}
        for url, s in sinks.items():
            new_url = next((fm.url(root) for rid, (fm, root) in self.sink_fms.items()
                            if self.m.roots[rid]["url"] == url), url)
            entries = [self._line(e.encode(), "ledger", "ledger").decode() for e in s["entries"]]
            moved[new_url] = {**s, "entries": entries}
        rec["sinks"] = moved
        return json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode()

    def relocated(self, rid: str, rel: str, data_sha: str | None, content: bytes | None):
        """(new content, or None if the file needs no change). Log files are read line by line."""
        kind = ("source" if rid == "checkpoint" and _SOURCE_LOG.match(rel) else
                "sink" if rid in self.sink_rules and _SINK_LOG.match(rel) else
                "operator" if rid == "checkpoint" and _OPERATOR_METADATA_V2.match(rel) else
                "ledger" if rid == "ledger" and "-truncate-" not in rel else None)
        if kind is None:
            return None
        if content is None:
            content = self.repo.read_object(data_sha)
        if kind == "operator":
            new = self._operator_metadata(content)
            return None if new == content else new
        lines = content.split(b"\n")
        if kind == "ledger":
            out = [self._ledger_line(x) if x.strip() else x for x in lines]
        else:
            out = lines[:1] + [self._line(x, rid, rel) for x in lines[1:]]
        new = b"\n".join(out)
        return None if new == content else new

    # -- the plan ---------------------------------------------------------------------------------------
    def build(self, to_batch: int | None) -> RestorePlan:
        m = self.m
        files = {rid: m.files(rid) for rid in m.roots}
        removed: set[tuple[str, str]] = set()
        rb_writes: list[tuple[str, str, bytes, str]] = []
        # a no-data batch the backup took beside its cut (``create.py``): written as it was, Spark runs it again
        left_planned: list[str] = [rel for rel in m.kept_planned if rel in {f[0] for f in files.get("checkpoint", [])}]
        kept = (f"{', '.join(left_planned)}: a no-data batch the backup took beside its cut at batch {m.batch}: it "
                "stays planned, and Spark runs it again at restart, emitting what its watermark closes"
                if left_planned else None)
        batch = m.batch
        if to_batch is not None:
            if m.doc["kind"] != "structured":
                raise BadInputError("--to-batch needs a Structured Streaming backup; this one is a DStream checkpoint",
                                    path=m.url)
            if to_batch > m.batch:
                raise RefusedError(f"the backup ends at batch {m.batch}: it cannot restore batch {to_batch}", path=m.url,
                                   fix=f"choose a batch up to {m.batch}, or a newer backup")
            view = BackupView(self.repo, m)
            intervals = m.doc.get("compact_intervals", {})
            vckpt = Checkpoint(view, "checkpoint", source_compact_interval=intervals.get("source", 10))
            vsinks = [SinkOutput(view, rid, intervals.get("sink", 10), origin=parse_url(m.roots[rid]["url"]))
                      for rid in self.sinks]
            vledger = Ledger(view, "ledger") if "ledger" in m.roots else None
            rb = plan_rollback(vckpt, to_batch, sinks=vsinks, ledger=vledger)
            removed = {(a.root, a.rel) for a in rb.actions if a.kind == "delete"}
            rb_writes = [(a.root, a.rel, rb.contents[a.sha256], a.reason) for a in rb.actions if a.kind == "write"]
            left_planned = rb.summary.get("kept_planned", [])  # a no-data batch the rollback keeps planned
            kept = rb.summary.get("kept")
            batch = to_batch
        roots = {"checkpoint": self.target_url, **{rid: fm.url(root) for rid, (fm, root) in self.sink_fms.items()}}
        pair = bool(self.sinks) and m.doc["kind"] == "structured"
        if "ledger" in m.roots or pair:
            roots["ledger"] = self.t_fm.url(self.ledger_path)
        plan = Plan("restore", roots, batch)
        metadata = None
        why = f"restored from backup {m.id} of {m.checkpoint_url}"
        for rid, entries in files.items():
            if rid not in roots:
                continue
            for rel, sha, size in entries:
                if (rid, rel) in removed or (rid == "ledger" and rel.startswith(PAIRING_DIR + "/")):
                    continue  # (the source's pairing records: the targets get their own, below)
                if rid == "checkpoint" and rel == "metadata" and m.doc["kind"] == "structured":
                    metadata = self.repo.read_object(sha)
                    self.objects.add(sha)
                    continue
                self.objects.add(sha)
                new = self.relocated(rid, rel, sha, None)
                if new is None:
                    plan.write_from(rid, rel, sha, size, self.repo.object_url(sha), why, phase=self._phase(rid, rel))
                else:
                    self._write(plan, rid, rel, new, why + ", paths relocated")
        for rid, rel, content, reason in rb_writes:
            new = self.relocated(rid, rel, None, content)
            self._write(plan, rid, rel, new if new is not None else content, reason)
        self._require_rules_used()
        plan.warnings += self._inputs_with_other_times()
        if to_batch is not None and to_batch < m.batch and "ledger" in m.roots:
            # records above the batch belong to the timeline the restore leaves behind
            name = f"{utc_stamp()}-truncate-restore-{m.id[-8:]}.json"
            body = json.dumps({"format": 1, "after_batch": to_batch, "op_id": f"restore-{m.id}"}).encode()
            plan.write("ledger", name, body, f"the ledger forgets batches after {to_batch}")
        if pair:
            self._pairing(plan, roots, m.doc["checkpoint"].get("query_id"))
        if left_planned:
            plan.summary["kept"] = kept
            plan.summary["kept_planned"] = left_planned
        plan.summary["restore"] = (f"backup {m.id} ({m.doc['kind']}, batch {m.batch}) of {m.checkpoint_url} into "
                                   f"{self.target_url}" + (f", rolled back to batch {to_batch}" if to_batch is not None
                                                           and to_batch < m.batch else ""))
        if self.rules[:-1 - len(self.sink_rules)]:
            plan.summary["relocate"] = [f"{r.old.path} -> {r.new.path}" for r in self.rules[:-1 - len(self.sink_rules)]]
        fms = {"checkpoint": (self.t_fm, self.t_root), **self.sink_fms}
        if "ledger" in roots:
            fms["ledger"] = (self.t_fm, self.ledger_path)
        anchor = Anchor(self.t_fm, self.t_root, self.target_url, None, checkpoint=True)
        return RestorePlan(plan, m, metadata, anchor, fms, self.objects, self.staged)

    def _inputs_with_other_times(self) -> list[str]:
        """A warning when input files a ``--relocate`` rule moved (a sample of the file-source log's entries, the
        oldest first) are not at their new place with the modification time the log recorded: a copy that reset
        them. Spark's file source forgets the files it has read whose time lies more than ``maxFileAge`` (7 days by
        default) before the newest it has seen, and takes a file of a newer time that it does not remember as new:
        it reads such a copy again (duplicated rows). One listing per directory of the sample."""
        by_dir: dict[str, list[tuple[str, int]]] = {}
        for path, logged in self.moved_inputs:
            by_dir.setdefault(path.rsplit("/", 1)[0], []).append((path, logged))
        differ, checked = [], 0
        for parent, entries in by_dir.items():
            try:
                fm, root = open_file_manager(parent, self.so)
                listed = {spark_url(spark_url_to_location(fm.url(f.path))): f for f in fm.list(root)}
            except (OSError, CheckpointOpsError):
                continue  # not reachable from here: Spark's own run will tell
            for path, logged in entries:
                info = listed.get(path)
                if info is None or info.mtime is None:
                    continue  # gone: Spark has read it already, and does not list it again
                checked += 1
                if abs(info.mtime * 1000 - logged) > 2000:
                    differ.append((path, info.mtime * 1000, logged))
        if not differ:
            return []
        path, now_ms, logged = differ[0]
        return [f"{len(differ)} of {checked} relocated input files checked have another modification time than the "
                f"source log recorded (e.g. {path}: {iso_ms(int(now_ms))}, logged {iso_ms(logged)}): a copy that reset "
                "them. Spark's file source forgets the files it has read that are more than maxFileAge (7 days by "
                "default) older than the newest it has seen, and reads such a file again when its copy is newer "
                "(duplicated rows); it also orders unread files by this time. Copy the input keeping modification "
                "times (cp -a, rsync -t) and restore again; an object store sets an upload's time itself, so there "
                "this holds for any query that ran longer than maxFileAge"]

    def _pairing(self, plan: Plan, roots: dict[str, str], query_id: str | None) -> None:
        """The restored checkpoint and sinks, recorded as paired at their new locations (both sides). The
        record is dated by the backup (the pairing it holds is as of then), so the plan is the same every time
        it is built: a crashed restore run again writes the same bytes."""
        stamp = self.m.created.replace("-", "").replace(":", "").replace("Z", ".000000Z")  # utc_stamp's form
        why = f"the targets are paired: restored together from backup {self.m.id}"
        sinks = tuple(roots[rid] for rid in self.sinks)
        plan.write("ledger", f"{PAIRING_DIR}/{stamp}-restore-{self.m.id[-8:]}.json",
                   PairingRecord(self.target_url, query_id, sinks, stamp, "backup restore").to_bytes(), why)
        for rid in self.sinks:
            plan.write(rid, PAIRING_FILE,
                       PairingRecord(self.target_url, query_id, (roots[rid],), stamp, "backup restore").to_bytes(), why)
        plan.summary["pairing"] = f"{self.target_url} with {', '.join(sinks)}"

    def _phase(self, rid: str, rel: str) -> str:
        """A sink's log goes before everything else (``sink-log-write``): written after the data files, a
        restore stopped in between left a sink target Spark read by listing it, as part of the table."""
        return "sink-log-write" if rid in self.sink_fms and rel.startswith(SINK_LOG_DIR + "/") else "write"

    def _write(self, plan: Plan, rid: str, rel: str, content: bytes, reason: str) -> None:
        """Relocated content: inline in the journal when small, else staged beside the target (a dry
        run only names where it would be staged)."""
        if len(content) <= 2**20:
            plan.write(rid, rel, content, reason, phase=self._phase(rid, rel))
            return
        sha = hashlib.sha256(content).hexdigest()
        staging = join(ops_dir(self.t_fm, self.t_root), "staging", uuid.uuid4().hex)
        if self.stage:
            self.t_fm.write_bytes(staging, content, overwrite=False)
            self.staged.append((self.t_fm, staging))
        plan.write_from(rid, rel, sha, len(content), self.t_fm.url(staging), reason, phase=self._phase(rid, rel))


def refuse_overlapping(targets: list[tuple[str, object, str]]) -> None:
    """BadInputError (exit 2) when two restore targets are the same place or one lies inside the other:
    the checkpoint's and a sink's files would mix (a raw reader of the output reads the checkpoint as
    data; the sink's maintenance lists the checkpoint), or two sinks' logs would collide."""
    for i, (what_a, fm_a, root_a) in enumerate(targets):
        for what_b, fm_b, root_b in targets[i + 1:]:
            if fm_a.location.scheme != fm_b.location.scheme:
                continue
            a, b = root_a.rstrip("/"), root_b.rstrip("/")
            # by place: two spellings of one directory (a symbolic link, ``//``) are one place
            how = how_places_overlap(fm_a.url(a), fm_b.url(b))
            if how is None:
                continue
            raise BadInputError(f"{what_a} ({fm_a.url(a)}) {how} {what_b} ({fm_b.url(b)}): the restored files would mix",
                                path=fm_b.url(b), fix="restore the checkpoint and each file sink into separate "
                                "directories, none inside another; nothing was written")


def _require_empty(fm, root: str, url: str) -> None:
    """Nothing at the target but our own lease: no file, and no directory either, even an empty one (on S3 a
    directory marker). An empty ``offsets/9``, ``commits/9`` or ``_spark_metadata/9`` is a batch to Spark's
    listing, which it then fails on (CONCURRENT_STREAM_LOG_UPDATE); one where the restore writes a file makes
    the write fail part-way, after the fence; an empty ``state/0/5`` is a partition the metadata does not have."""
    listed = fm.walk(root, empty_dirs=True)
    found = [f for f in listed if not f.is_dir and not is_lease_file(f.path[len(root) + 1:])]  # our lease: not content
    if found:
        # Spark's own names first, hidden ones (Hadoop's ``.crc`` sidecars) after: what the user recognises
        names = sorted((f.path[len(root) + 1:] for f in found),
                       key=lambda rel: (rel.rsplit("/", 1)[-1].startswith("."), rel))
        if "metadata" in names:  # an operation of ours stopped there (this restore, run before): finish it instead
            with contextlib.suppress(OSError):
                data = fm.read_bytes(f"{root}/metadata")
                if is_fence(data):
                    fence = parse_fence(data)
                    lease = read_lease(fm, root)
                    if lease.present and lease.holder is not None and not lease.stale_reason:  # not interrupted
                        raise RefusedError(f"the target holds a checkpoint-ops {fence.operation} ({fence.op_id}) in "
                                           f"progress (its lease is {lease.describe()}): a new restore would not "
                                           "finish that one", path=url,
                                           fix=f"wait for it to finish (`checkpoint-ops lease show {url}` shows its "
                                               "holder), or restore into a new, empty location; if it stops, what it "
                                               "says (or `checkpoint-ops history` there) names how to finish it")
                    raise RefusedError(f"the target holds a checkpoint-ops {fence.operation} ({fence.op_id}) that "
                                       "was interrupted: it is not empty, and a new restore would not finish that one",
                                       path=url, fix=recovery_advice(fence, url))
        raise BadInputError(f"the target is not empty: it holds {', '.join(names[:5])}"
                            + (f" and {len(names) - 5} more" if len(names) > 5 else ""), path=url,
                            fix="restore into a new, empty location (a restore never overwrites)")
    dirs = sorted(f.path[len(root) + 1:].rstrip("/") for f in listed if f.is_dir)
    if dirs:
        raise BadInputError(f"the target holds {'a directory' if len(dirs) == 1 else 'directories'} with no file "
                            f"below: {', '.join(dirs[:5])}{f' and {len(dirs) - 5} more' if len(dirs) > 5 else ''} "
                            "(a restore writes into an empty location: Spark reads an empty offsets/9 as batch 9 and "
                            "fails, and one where the restore writes a file stops its write part-way)",
                            path=fm.url(f"{root}/{dirs[0]}"), fix="remove them, or restore into a new, empty "
                            "location; nothing was written")


def _require_no_ledger(fm, ledger: str, target_url: str) -> None:
    """The target's batch ledger (beside it, in the hidden ops directory) must hold nothing: what a ledger
    holds there records another checkpoint that lived at this place (removed by hand, which leaves the hidden
    directory). Restored over it, the two timelines' records would merge, and every command that reads the
    ledger (fsck, inspect, rollback beyond Spark's window) would judge the restored checkpoint by batches it
    never ran. A restore that was undone left it empty (undo removes what the restore wrote)."""
    found = sorted(f.path[len(ledger.rstrip("/")) + 1:] for f in fm.walk(ledger))
    if found:
        raise BadInputError(
            f"the target's batch ledger already holds {len(found)} file(s) ({', '.join(found[:3])}"
            + (", ..." if len(found) > 3 else "") + f"): the record of a checkpoint that was at {target_url} (another "
            "query's, or this query's own from after the backup), which the restore would merge with the backup's",
            path=fm.url(ledger),
            fix=f"if that checkpoint is gone for good, remove its ledger (`rm -r {fm.url(ledger)}`, or the whole "
                "hidden directory beside it with its journals and undo records), then restore again; else restore "
                "into another location; nothing was written")


def plan_restore(repo: Repository, backup_id: str, target_url: str, sink_targets: list[str] = (),
                 relocate: list[str] = (), to_batch: int | None = None, storage_options: dict | None = None,
                 stage: bool = False) -> RestorePlan:
    """The restore of one backup (see module docstring). ``stage`` writes big relocated files beside
    the target (done when applying; a dry run only hashes them)."""
    m = repo.manifest(backup_id)
    r = _Restore(repo, m, target_url, list(sink_targets), list(relocate), storage_options, stage)
    try:
        return r.build(to_batch)
    except BaseException:
        clear_staged(r)  # planning failed: nothing it staged will be used (best effort: its error is the one raised)
        raise


def verify_objects(repo: Repository, shas: set[str], backup: Manifest | None = None) -> None:
    """Read every object and check its hash; any bad one is unusable input (exit 2), named, and marked bad at
    the destination as a verification marks it (``backup list`` then shows every backup holding it as failed),
    with the newest other backup of the same query that holds no bad object (``backup``: the one restored)."""
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = dict(zip(sorted(shas), pool.map(repo.object_hash, sorted(shas))))
    bad = sorted(h for h, g in got.items() if g != h)
    if bad:
        h = bad[0]
        with contextlib.suppress(OSError, CheckpointOpsError):  # a destination we may only read: said anyway
            repo.mark_bad(bad)
        raise BadInputError(f"stored object {'is missing' if got[h] is None else 'does not match its hash'}"
                            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "") + ": nothing was restored",
                            path=repo.object_url(h), fix="`checkpoint-ops backup verify` lists every bad object; "
                            + _without(repo, set(bad), backup))


def _without(repo: Repository, bad: set[str], backup: Manifest | None) -> str:
    """Which backup to restore instead: the newest other one of the same checkpoint and query holding none of
    ``bad`` or of the objects any verification marked bad; with its batch against this one's, and whether it
    was verified (its other objects are only known good once it is)."""
    if backup is None:
        return "restore another backup"
    query = backup.doc["checkpoint"].get("query_id")
    try:
        bad = bad | repo.bad_objects()
        others = [m for m in repo.manifests() if m.id != backup.id and m.checkpoint_url == backup.checkpoint_url
                  and m.doc["checkpoint"].get("query_id") == query]
        records = repo.verified()
    except (OSError, CheckpointOpsError):
        return "restore another backup"
    sound = [m for m in sorted(others, key=lambda m: m.id, reverse=True) if not (m.hashes() & bad)]
    if not sound:
        return (f"no other backup of {backup.checkpoint_url} (query {query}) at this destination is free of them: take "
                "a new backup (`checkpoint-ops backup create`) if the checkpoint is still there")
    m = sound[0]
    if m.batch is None or backup.batch is None or m.batch == backup.batch:
        when = f"batch {m.batch}"
    else:
        when = f"batch {m.batch}, {'later' if m.batch > backup.batch else 'earlier'} than this backup's {backup.batch}"
    record = records.get(m.id)
    checked = (f"verified {record.get('at')}" if record and record.get("ok") else
               f"not verified: run `checkpoint-ops backup verify {repo.url} {m.id}` first")
    return (f"restore backup {m.id} instead (the newest other backup of {backup.checkpoint_url}, query {query}, "
            f"that holds none of them: {when}, taken {m.created}; {checked}), with the same command and that "
            "backup id")


def restore_backup(rp: RestorePlan, repo: Repository, storage_options: dict | None = None,
                   progress: bool = False, guard=None) -> AppliedOperation:
    """Check every object, then apply the restore plan (fenced until the last file is written)."""
    try:
        verify_objects(repo, rp.objects, rp.manifest)
    except BaseException:
        clear_staged(rp)
        raise
    hooks = JournalHooks(final_metadata=rp.metadata, undo_guard={"checkpoint": ["offsets", "commits"]},
                         left_planned=rp.plan.summary.get("kept_planned", []),
                         extra={"backup": {"destination": repo.url, "id": rp.manifest.id}})
    result = apply_plan(rp.plan, rp.anchor, rp.fms, storage_options, progress, hooks, guard=guard)
    clear_staged(rp)  # a resume would still need them; an applied restore does not
    # what the checks above read from the backup, beside what the executor did
    result.requests["backup"] = repo.fm.counter.snapshot()
    result.retries["backup"] = repo.fm.counter.retries()
    return result


def clear_staged(rp: RestorePlan) -> None:
    """Delete what the plan staged. Best effort when the store is failing: an error on the way out
    must not hide the one that stopped the restore (staged files are hidden, beside the target)."""
    for fm, path in rp.staged or []:
        with contextlib.suppress(StoreUnavailableError):
            fm.delete_many([path])


def hold_restore_intent(repo: Repository, backup_id: str, target_url: str, warn: Callable[[str], None] | None,
                        waiting: str) -> HeldClaim:
    """A restore's intent at ``repo``, written before it reads an object, then a running prune waited for (``warn``
    told, ``waiting`` naming what waits); released again if the wait fails. Held until the caller releases it: a
    prune meanwhile collects none of the objects the restore reads."""
    claim = repo.hold_restore_claim(backup_id, target_url)
    try:
        wait_for_prune(repo, warn, waiting)
    except BaseException:
        claim.release_quietly()
        raise
    return claim


def hold_for_resume(record: dict, target_url: str, ex, storage_options: dict | None = None, hold: bool = True,
                    rolling_forward: bool = False, warn: Callable[[str], None] | None = None):
    """Before a killed restore is resumed (or rolled forward after a killed undo): the restore's intent at its
    destination again, held until the caller releases it, and a running prune waited for, as the restore
    itself does (``RestoreOperation.plan``): a prune meanwhile collects none of the objects the resume reads.
    A prune while nothing ran may have collected them already: that is refused here, before anything is
    changed, naming ``undo``, as no resume can finish it. None for another operation's journal (``record``), and
    for a dry run (``hold`` False: checked alike, no intent written)."""
    backup = record.get("backup") if record.get("operation") == "restore" else None
    if not backup:
        return None
    dest, backup_id = backup["destination"], backup["id"]
    try:
        repo = Repository.open(dest, storage_options)
    except BadInputError as e:  # not an outage: nothing is wrong with the destination then
        raise BadInputError(f"the backup destination this restore copies from cannot be read: {e.problem}",
                            path=dest, fix=f"mend it and resume again; or remove what the restore wrote with "
                            f"`checkpoint-ops undo {target_url}` and restore from another destination") from None
    claim = hold_restore_intent(repo, backup_id, target_url, warn, "the resume of the restore") if hold else None
    try:
        missing = ex.sources_missing()
    except BaseException:
        if claim is not None:
            claim.release_quietly()  # the error that stopped it matters, not this cleanup's
        raise
    if missing:
        if claim is not None:
            claim.release_quietly()  # the error that stopped it matters, not this cleanup's
        interrupted = "its undo" if rolling_forward else "the restore"
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise BadInputError(
            f"the restore of backup {backup_id} cannot be finished: content it still has to copy is gone from "
            f"{dest} ({missing[0]}{more}; pruned or deleted after {interrupted} was interrupted); nothing was changed",
            path=target_url, fix=f"remove what the restore wrote with `checkpoint-ops undo {target_url}`, then restore "
            f"another backup (`checkpoint-ops backup list {dest}` lists them)")
    return claim


class RestoreOperation(Operation):
    """``checkpoint-ops backup restore``: a backup into an empty target (module docstring)."""

    recovery = "journal"

    name = "restore"

    def __init__(self, dest_url: str, backup_id: str, target_url: str, sink_targets: list[str] = (),
                 relocate: list[str] = (), to_batch: int | None = None, storage_options: dict | None = None):
        self.dest_url, self.backup_id, self.target_url = dest_url, backup_id, target_url
        self.sink_targets, self.relocate, self.to_batch = list(sink_targets), list(relocate), to_batch
        self.storage_options = storage_options
        self.repo: Repository | None = None
        self.rp: RestorePlan | None = None
        self._claim = None  # the restore's intent at the destination, while it plans and applies
        fm, root = open_file_manager(target_url, storage_options)
        self._sites = [Site(fm, root, f"restore target {target_url}")] + [
            Site(*open_file_manager(url, storage_options), f"sink target {url}") for url in self.sink_targets]

    def sites(self) -> list[Site]:
        return self._sites

    def _validate(self) -> _Restore:
        self.repo = Repository.open(self.dest_url, self.storage_options)
        m = self.repo.manifest(self.backup_id)
        return _Restore(self.repo, m, self.target_url, self.sink_targets, self.relocate, self.storage_options, False)

    def precheck(self) -> None:
        """Targets need not exist: everything that can be judged without reading objects is, before the
        leases (which create the target directories) are taken."""
        self._validate()

    def plan(self, stage: bool) -> Plan:
        """The plan; for a real run (``stage``), under a restore's intent at the destination, taken before an
        object is read and held until the apply ends: a prune collects no object meanwhile (one running now
        is waited for), so none this restore reads goes from under it."""
        if stage:
            self._claim = hold_restore_intent(self.repo, self.backup_id, self.target_url, self.warn, "the restore")
        try:
            self.rp = plan_restore(self.repo, self.backup_id, self.target_url, self.sink_targets, self.relocate,
                                   self.to_batch, self.storage_options, stage=stage)
        except BaseException:
            self._release_claim()
            raise
        return self.rp.plan

    def apply(self, plan: Plan, ctx: ApplyContext) -> AppliedOperation:
        try:
            if self._claim is not None:
                self._claim.check()  # it held all along: no prune took it for stale and collected objects
            return restore_backup(self.rp, self.repo, ctx.storage_options, ctx.progress, guard=ctx.guard)
        finally:
            self._release_claim()

    def discard(self, plan: Plan) -> None:
        self._release_claim()
        if self.rp is not None:
            clear_staged(self.rp)

    def _release_claim(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:
            claim.release_quietly()  # the restore's own outcome matters; on a failing store the intent goes stale

    def describe(self, plan: Plan, outcome: AppliedOperation) -> str:
        return (f"Restored backup {self.backup_id} into {self.target_url} ({outcome.op_id}); batch {plan.target_batch} "
                f"is the last committed one. Undo with: checkpoint-ops undo {self.target_url}")
