"""Benchmark: rolling back 100 batches of a 10,000-batch checkpoint with 200 HDFS state partitions.

Measured side by side, in one run, on fresh copies of the same synthetic checkpoint
(``synthetic.py``: Spark's real file names and formats):

* local disk: ``checkpoint-ops rollback --yes`` (listing, planning, journal, fence, moving every file
  aside for undo) against a plain loop that unlinks exactly the same files, given the list; and
  against the same loop preceded by the directory walk any script needs to find them. Each side runs on
  a copy synced to disk first (``flushed``: a checkpoint written long ago, whose files have their blocks
  allocated) and on an unsynced copy (``unflushed``: an unlink of a file whose blocks were never
  allocated only drops pages, which flatters the loop); ``--conditions`` picks;
* the local S3 server (moto, HTTP, a versioned bucket): the same rollback against the minimal
  LIST of the prefix plus batched DeleteObjects of exactly the same keys; requests counted at the
  HTTP layer.

Targets: S3 requests <= 1.1x the minimal LIST + batched deletes; local wall time <= 1.2x the plain
loop (issue 3), and <= 2x the walk plus the unlink loop (issue 15 item 5). The local part ends with
where one rollback's time goes, phase by phase.

Usage: ``python benchmarks/rollback.py [--batches N] [--partitions P] [--rollback R] [--repeat K] [--no-s3]
[--conditions flushed,unflushed]``
Prints a markdown report (recorded in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.synthetic import files, write_local  # noqa: E402
from checkpoint_ops.cli import main as cli_main  # noqa: E402


def run_cli(*args) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main([str(a) for a in args])
    if code != 0:
        raise SystemExit(f"checkpoint-ops {' '.join(map(str, args))} exited {code}: {out.getvalue()[:2000]}")
    return json.loads(out.getvalue())


def peak_rss_mb(cmd: list[str], env: dict | None = None) -> float:
    """Peak resident memory of a child process (ru_maxrss is in KiB on Linux)."""
    code = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    res = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, env=env)
    return int(res.stdout.strip().splitlines()[-1]) / 1024


# ---- local disk ---------------------------------------------------------------------------------


def bench_local(args, work: str) -> dict:
    template = os.path.join(work, "template", "ckpt")
    t = time.perf_counter()
    n = write_local(template, batches=args.batches, partitions=args.partitions, retain_state=args.retain_state)
    gen_s = time.perf_counter() - t
    target = args.batches - 1 - args.rollback

    def fresh(name):
        d = os.path.join(work, name, "ckpt")
        if os.path.exists(os.path.dirname(d)):
            shutil.rmtree(os.path.dirname(d))
        shutil.copytree(template, d)
        return d

    # The exact files the rollback deletes, from a dry run (the plan is the contract).
    plan = run_cli("rollback", fresh("plan"), "--to-batch", target, "--dry-run", "--json")["plan"]
    rels = [a["rel"] for a in plan["actions"] if a["kind"] == "delete"]

    conditions = {}
    for condition in args.conditions:
        ours, loop, walk_loop = [], [], []
        for rep in range(args.repeat):
            for which in (["ours", "loop", "walk"] if rep % 2 == 0 else ["walk", "loop", "ours"]):
                d = fresh(which)
                if condition == "flushed":  # as a checkpoint written long ago is: its blocks allocated, on disk
                    os.sync()
                if which == "ours":
                    t = time.perf_counter()
                    run_cli("rollback", d, "--to-batch", target, "--yes", "--json")
                    ours.append(time.perf_counter() - t)
                elif which == "loop":
                    paths = [os.path.join(d, r) for r in rels]
                    t = time.perf_counter()
                    for p in paths:
                        os.unlink(p)
                    loop.append(time.perf_counter() - t)
                else:
                    wanted = set(rels)
                    t = time.perf_counter()
                    for dirpath, _, names in os.walk(d):
                        rel_dir = os.path.relpath(dirpath, d)
                        for name in names:
                            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                            if rel in wanted:
                                os.unlink(os.path.join(dirpath, name))
                    walk_loop.append(time.perf_counter() - t)
        conditions[condition] = {
            "ours": statistics.median(ours), "loop": statistics.median(loop), "walk_loop": statistics.median(walk_loop),
            "ours_all": ours, "loop_all": loop, "walk_all": walk_loop,
        }

    profile_copy = fresh("profile")
    if "flushed" in args.conditions:
        os.sync()
    profile = profile_rollback(profile_copy, target)
    d = fresh("memory")
    rss = peak_rss_mb([sys.executable, "-m", "checkpoint_ops.cli", "rollback", d, "--to-batch", str(target),
                       "--yes", "--json"], env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))
    baseline_rss = peak_rss_mb([sys.executable, "-c", "import checkpoint_ops.cli"],
                               env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))
    return {
        "files": n, "generate_s": gen_s, "deleted": len(rels), "target": target, "conditions": conditions,
        "rss_mb": rss, "import_rss_mb": baseline_rss, "profile": profile,
    }


# Where a rollback's time goes: wall time inside each of these (nested spans overlap; "rest" is the total
# minus the outermost spans). Timing spans, not cProfile: its per-call cost would swamp the 44,600 renames.
PHASES = [
    ("listing: one walk of the checkpoint, indexed", "checkpoint_ops.model.listing", "Listing.scan"),
    ("planning (all of it; the next three rows are part of it)", "checkpoint_ops.rollback", "plan_rollback"),
    ("  state model: every state file name classified", "checkpoint_ops.model.state", "StateModel._scan"),
    ("  restart set of the target checked (Spark's loading rule, crc sizes)", "checkpoint_ops.rollback",
     "check_restart_set"),
    ("  warnings about damaged files the rollback removes", "checkpoint_ops.rollback", "damage_in_removed"),
    ("journal: the plan's compact rows, written and synced", "checkpoint_ops.executor", "write_journal"),
    ("moving the deleted files aside (a link and an unlink each)", "checkpoint_ops.executor",
     "Executor._retire"),
    ("fence (metadata replaced)", "checkpoint_ops.executor", "Executor._fence"),
    ("printing the plan as JSON", "checkpoint_ops.cli", "print_json"),
]


def profile_rollback(d: str, target: int) -> dict:
    """One more rollback on a fresh copy, with a timing span around each phase of ``PHASES``."""
    import functools
    import importlib

    spent: dict[str, float] = {label: 0.0 for label, _, _ in PHASES}
    undo = []
    for label, module, name in PHASES:
        owner = importlib.import_module(module)
        attr = name
        if "." in name:
            cls, attr = name.split(".")
            owner = getattr(owner, cls)
        raw = owner.__dict__[attr]
        fn = raw.__func__ if isinstance(raw, classmethod) else raw

        def timed(*a, _fn=fn, _label=label, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                spent[_label] += time.perf_counter() - t0

        functools.update_wrapper(timed, fn)
        setattr(owner, attr, classmethod(timed) if isinstance(raw, classmethod) else timed)
        undo.append((owner, attr, raw))
    try:
        t = time.perf_counter()
        run_cli("rollback", d, "--to-batch", target, "--yes", "--json")
        total = time.perf_counter() - t
    finally:
        for owner, attr, raw in reversed(undo):
            setattr(owner, attr, raw)
    return {"total": total, "phases": spent}


# ---- S3 server ----------------------------------------------------------------------------------


def start_s3() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(HERE), "tests", "s3_server.py"), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    assert proc.stdout.readline().strip() == "ready"
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint)
    return proc, endpoint


def upload(endpoint: str, bucket: str, args) -> int:
    import boto3
    from concurrent.futures import ThreadPoolExecutor

    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    items = list(files(batches=args.batches, partitions=args.partitions, retain_state=args.retain_state))
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda kv: s3.put_object(Bucket=bucket, Key=f"ckpt/{kv[0]}", Body=kv[1]), items))
    return len(items)


class HttpCounter:
    def __init__(self, client):
        self.n = {}
        client.meta.events.register("before-send.s3", self)

    def __call__(self, event_name="", **_):
        op = event_name.rsplit(".", 1)[-1]
        self.n[op] = self.n.get(op, 0) + 1

    @property
    def total(self):
        return sum(self.n.values())


def bench_s3(args) -> dict:
    import boto3

    proc, endpoint = start_s3()
    try:
        target = args.batches - 1 - args.rollback
        t = time.perf_counter()
        n = upload(endpoint, "bench-ours", args)
        upload(endpoint, "bench-base", args)
        upload_s = time.perf_counter() - t
        plan = run_cli("rollback", "s3://bench-ours/ckpt", "--to-batch", target, "--dry-run", "--json")["plan"]
        keys = [f"ckpt/{a['rel']}" for a in plan["actions"] if a["kind"] == "delete"]

        # baseline: one paginated LIST of the prefix, then batched deletes of exactly those keys
        s3 = boto3.client("s3", endpoint_url=endpoint)
        counter = HttpCounter(s3)
        t = time.perf_counter()
        listed = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench-base", Prefix="ckpt/"):
            listed += len(page.get("Contents", []))
        for i in range(0, len(keys), 1000):
            s3.delete_objects(Bucket="bench-base", Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]],
                                                           "Quiet": True})
        base_s = time.perf_counter() - t
        base_requests = dict(counter.n)

        t = time.perf_counter()
        r = run_cli("rollback", "s3://bench-ours/ckpt", "--to-batch", target, "--yes", "--json")
        ours_s = time.perf_counter() - t
        # the ledger truncation record lives beside the checkpoint: count it too (it is in "checkpoint")
        ours_requests = r["result"]["requests"]["checkpoint"]
        return {"objects": n, "listed": listed, "deleted": len(keys), "upload_s": upload_s,
                "base_s": base_s, "base_requests": base_requests, "ours_s": ours_s, "ours_requests": ours_requests}
    finally:
        proc.terminate()
        proc.wait(10)


def report(args, local: dict | None, s3: dict | None) -> str:
    lines = [f"### Rollback of {args.rollback} batches (checkpoint of {args.batches} batches, {args.partitions} HDFS "
             "state partitions)", ""]
    lines.append(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                 f"{time.strftime('%Y-%m-%d')}. Command: `python benchmarks/rollback.py "
                 f"--batches {args.batches} --partitions {args.partitions} --rollback {args.rollback} "
                 f"--repeat {args.repeat}" + (" --no-s3" if args.no_s3 else "") + (" --no-local" if args.no_local else "")
                 + f" --conditions {','.join(args.conditions)}`. Load average (1 min) at the start and the end: {args.load[0]:.1f}, "
                 f"{args.load[1]:.1f}.")
    lines.append("")
    if local:
        l = local
        lines += [
            f"**Local disk** ({l['files']} files including Hadoop `.crc` sidecars; the rollback deletes {l['deleted']}). "
            f"Median of {args.repeat} runs, each on a fresh copy of the checkpoint. *Flushed*: the copy is synced "
            "to disk before the timed command (outside the timing), as a checkpoint written long ago is, so an "
            "unlink frees allocated blocks; *unflushed*: the copy's pages are still dirty, its blocks not yet "
            "allocated, and an unlink only drops them from the page cache:",
            "",
            "| files on disk | | seconds | ratio |",
            "|---|---|---|---|",
        ]
        for condition, c in l["conditions"].items():
            lines += [
                f"| {condition} | plain loop unlinking exactly the same files (list given) | {c['loop']:.3f} | 1.00 |",
                f"| {condition} | walk the checkpoint, then unlink the same files | {c['walk_loop']:.3f} | "
                f"{c['walk_loop'] / c['loop']:.2f} |",
                f"| {condition} | `checkpoint-ops rollback --yes` (list, plan, journal, fence, move aside for undo) | "
                f"{c['ours']:.3f} | **{c['ours'] / c['loop']:.2f}** vs loop, **{c['ours'] / c['walk_loop']:.2f}** vs "
                "walk + loop |",
            ]
        lines.append("")
        for condition, c in l["conditions"].items():
            lines.append(f"All runs, {condition} (ours / loop / walk+loop): "
                         f"{', '.join(f'{x:.2f}' for x in c['ours_all'])} / {', '.join(f'{x:.2f}' for x in c['loop_all'])} / "
                         f"{', '.join(f'{x:.2f}' for x in c['walk_all'])}.")
        lines += [
            "",
            f"Peak memory of the rollback process: {l['rss_mb']:.0f} MiB (the interpreter with our imports alone: "
            f"{l['import_rss_mb']:.0f} MiB).",
            "",
            f"Where the time goes (one more rollback on a fresh copy, {l['profile']['total']:.2f} s, timing spans; "
            "indented rows are part of the row above them):",
            "",
            "| phase | seconds |",
            "|---|---|",
            *[f"| {label.strip() if not label.startswith('  ') else '&nbsp;&nbsp;' + label.strip()} | {v:.3f} |"
              for label, v in l["profile"]["phases"].items()],
            f"| everything else (arguments, lease, activity check, interpreter) | "
            f"{l['profile']['total'] - sum(v for k, v in l['profile']['phases'].items() if not k.startswith('  ')):.3f} |",
            "",
        ]
    if s3:
        b, o = s3["base_requests"], s3["ours_requests"]
        bt, ot = sum(b.values()), sum(o.values())
        lines += [
            f"**S3 server** (moto over HTTP on loopback, versioned bucket; {s3['objects']} objects, no `.crc` sidecars as "
            f"S3A writes none; the rollback deletes {s3['deleted']}). HTTP requests counted at the client:",
            "",
            "| | requests | by operation | seconds |",
            "|---|---|---|---|",
            f"| minimal: LIST the prefix + batched DeleteObjects of the same keys | {bt} | {json.dumps(b)} | "
            f"{s3['base_s']:.2f} |",
            f"| `checkpoint-ops rollback --yes` | {ot} (**{ot / bt:.2f}x**) | {json.dumps(o)} | {s3['ours_s']:.2f} "
            f"(**{s3['ours_s'] / s3['base_s']:.2f}x**) |",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=10_000)
    p.add_argument("--partitions", type=int, default=200)
    p.add_argument("--retain-state", type=int, default=200, help="state versions kept on disk")
    p.add_argument("--rollback", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-s3", action="store_true")
    p.add_argument("--no-local", action="store_true")
    p.add_argument("--conditions", default="flushed,unflushed",
                   help="comma-separated: flushed (the copy synced to disk before each timed command), unflushed")
    args = p.parse_args()
    args.conditions = [c for c in args.conditions.split(",") if c]
    if not set(args.conditions) <= {"flushed", "unflushed"}:
        p.error("--conditions takes flushed and/or unflushed")
    args.load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-rollback-") as work:
        local = None if args.no_local else bench_local(args, work)
        s3 = None if args.no_s3 else bench_s3(args)
    args.load.append(os.getloadavg()[0])
    print(report(args, local, s3))


if __name__ == "__main__":
    main()
