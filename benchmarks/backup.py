"""Benchmark: backing up a checkpoint of ~50,000 files, full and then incremental, against rclone.

The checkpoint is synthetic (``synthetic.py``: Spark's real file names and formats, distinct content
per state file, realistic sizes: 2 KiB deltas, 32 KiB snapshots, ~230 MB in all), as Spark leaves it
with ``minBatchesToRetain`` 200 for state and 100 for logs (no Hadoop ``.crc`` sidecars, as on S3). Then
100 more batches run: new offsets, commits, source-log entries and 22,500 new state files appear, and
retention deletes as many old ones.

Measured side by side, in one run, each a child process timed end to end:

* ``checkpoint-ops backup create CKPT DEST`` (consistent cut, hash, content-addressed put-if-absent,
  manifest), then again after the 100 batches (incremental: unchanged files are not read);
* ``rclone copy CKPT DEST`` (Debian's rclone, default settings), then again on the advanced tree.

Both local disk to local disk and local disk to the S3 server (moto over HTTP on loopback, run inside
this process so every request is counted at the server).

Targets (issue 7): full <= 1.0x rclone's wall time; incremental <= 0.1x rclone's incremental copy and
O(new files) S3 requests. Issue 15 item 5 (local disk): full and incremental <= 1.5x ``rclone copy``.

Usage: ``python benchmarks/backup.py [--partitions 225] [--batches 5000] [--advance 100] [--repeat 1]``

``--repeat N``: N full backups (each into destinations of its own, ours and rclone's), then after the
advance N incremental ones into the same N pairs; the two sides take turns going first, and the table
shows the medians and every run (on a shared machine one run says little).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks.synthetic import advance_local, files  # noqa: E402


class CountingS3:
    """moto's S3 in a thread of this process, counting requests by operation."""

    def __init__(self):
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, *a, **k):
                pass

        app = DomainDispatcherApplication(create_backend_app)
        self.counts = collections.Counter()
        lock = threading.Lock()

        def counted(environ, start_response):
            q = environ.get("QUERY_STRING", "")
            op = environ["REQUEST_METHOD"] + (" list" if "list-type" in q else " delete-batch" if "delete" in q else "")
            with lock:
                self.counts[op] += 1
                return list(app(environ, start_response))

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = make_server("127.0.0.1", self.port, counted, threaded=True, request_handler=Quiet)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def take(self) -> dict:
        out = dict(self.counts)
        self.counts.clear()
        return out


def run(cmd: list[str], env: dict) -> tuple[float, str]:
    """Time ``cmd`` end to end. Dirty pages of what ran before (the tree just generated or advanced, the
    other tool's copy) are flushed first, outside the timing: rclone never syncs, and our one sync pass
    before the manifest must not pay for its writes."""
    os.sync()
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-3000:]}")
    return time.perf_counter() - t, p.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=225)
    ap.add_argument("--batches", type=int, default=5000)
    ap.add_argument("--advance", type=int, default=100)
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side per phase (medians reported)")
    args = ap.parse_args()
    if not shutil.which("rclone"):
        raise SystemExit("rclone is not installed (Debian: apt-get install rclone)")
    shape = dict(partitions=args.partitions, retain_state=200, retain_log=100, retain_offsets=100,
                 delta_bytes=2048, snapshot_bytes=32768)
    before, after = dict(batches=args.batches, **shape), dict(batches=args.batches + args.advance, **shape)
    args.load = [os.getloadavg()[0]]
    work = tempfile.mkdtemp(prefix="backup-bench-")
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}  # rclone rejects it with a plain-HTTP endpoint
    s3 = None
    if not args.no_s3:
        s3 = CountingS3()
        env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                   AWS_ENDPOINT_URL=s3.endpoint, RCLONE_CONFIG_MOTO_TYPE="s3", RCLONE_CONFIG_MOTO_PROVIDER="Other",
                   RCLONE_CONFIG_MOTO_ENDPOINT=s3.endpoint, RCLONE_CONFIG_MOTO_ACCESS_KEY_ID="testing",
                   RCLONE_CONFIG_MOTO_SECRET_ACCESS_KEY="testing", RCLONE_CONFIG_MOTO_REGION="us-east-1")
        import boto3

        boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="bench")
    try:
        template = os.path.join(work, "template")
        t = time.perf_counter()
        nfiles = nbytes = 0
        for rel, data in files(**before):
            p = os.path.join(template, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
            nfiles += 1
            nbytes += len(data)
        gen = time.perf_counter() - t
        targets = {"local": (os.path.join(work, "ours-dest"), os.path.join(work, "rclone-dest"))}
        if s3:
            targets["S3 server"] = ("s3://bench/ours", "moto:bench/rclone")
        rows = {}
        for name, (ours_dest, rclone_dest) in targets.items():
            ckpt = os.path.join(work, f"ckpt-{name.replace(' ', '-')}", "ckpt")
            shutil.copytree(template, ckpt)
            r = {}
            for phase in ("full", "incremental"):
                if phase == "incremental":
                    written, deleted = advance_local(ckpt, before, after)
                    r["advance"] = {"written": written, "deleted": deleted}
                for i in range(args.repeat):
                    suffix = f"-{i}" if args.repeat > 1 else ""
                    sides = [("ours", [sys.executable, "-m", "checkpoint_ops.cli", "backup", "create", ckpt,
                                       ours_dest + suffix, "--json"]),
                             ("rclone", ["rclone", "copy", ckpt, rclone_dest + suffix])]
                    for side, cmd in (sides if i % 2 == 0 else sides[::-1]):
                        if s3:
                            s3.take()
                        seconds, out = run(cmd, env)
                        r.setdefault(f"{side}_{phase}_all", []).append(seconds)
                        if side == "ours":
                            r[f"ours_{phase}"] = json.loads(out)
                        r[f"{side}_{phase}_requests"] = s3.take() if s3 and name != "local" else {}
                for side in ("ours", "rclone"):
                    r[f"{side}_{phase}_s"] = statistics.median(r[f"{side}_{phase}_all"])
            rows[name] = r
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if s3:
            s3.server.shutdown()
    args.load.append(os.getloadavg()[0])
    report(args, nfiles, nbytes, gen, rows)


def report(args, nfiles: int, nbytes: int, gen: float, rows: dict) -> None:
    rclone_version = subprocess.run(["rclone", "version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"### Backup of a {nfiles:,}-file checkpoint ({nbytes / 1e6:.0f} MB), full, then after {args.advance} "
          "more batches\n")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{rclone_version}, {time.strftime('%Y-%m-%d')}. Command: `python benchmarks/backup.py --partitions "
          f"{args.partitions} --batches {args.batches} --advance {args.advance}"
          + (f" --repeat {args.repeat}" if args.repeat > 1 else "") + "`. Load average (1 min) at the start "
          f"and the end: {args.load[0]:.1f}, {args.load[1]:.1f}."
          + (f" Times are medians of {args.repeat} runs." if args.repeat > 1 else "") + "\n")
    print("| destination | backup | `checkpoint-ops backup create` | `rclone copy` | ratio | files read / objects new |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        for phase in ("full", "incremental"):
            o = r[f"ours_{phase}"]
            ratio = r[f"ours_{phase}_s"] / r[f"rclone_{phase}_s"]
            print(f"| {name} | {phase} | {r[f'ours_{phase}_s']:.2f} s | {r[f'rclone_{phase}_s']:.2f} s | "
                  f"**{ratio:.2f}x** | {o['read_files']:,} / {o['new_objects']:,} ({o['new_bytes'] / 1e6:.1f} MB) |")
    if args.repeat > 1:
        for name, r in rows.items():
            for phase in ("full", "incremental"):
                runs = ", ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(r[f"ours_{phase}_all"], r[f"rclone_{phase}_all"]))
                print(f"\nAll runs, {name} {phase} (ours / rclone, s): {runs}.", end="")
        print()
    for name, r in rows.items():
        if r.get("ours_full_requests"):
            print(f"\nS3 requests counted at the server ({name}):\n")
            print("| backup | ours | by operation | rclone | by operation |")
            print("|---|---|---|---|---|")
            for phase in ("full", "incremental"):
                o, c = r[f"ours_{phase}_requests"], r[f"rclone_{phase}_requests"]
                print(f"| {phase} | {sum(o.values()):,} | {dict(sorted(o.items()))} | {sum(c.values()):,} | "
                      f"{dict(sorted(c.items()))} |")
        print(f"\nThe {args.advance} batches wrote {r['advance']['written']:,} files and retention deleted "
              f"{r['advance']['deleted']:,} ({name}).")


if __name__ == "__main__":
    main()
