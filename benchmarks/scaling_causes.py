"""Is a scaling regression's cause named right? Injected classes against one baseline, counted.

Records a baseline of one DDP group (ws1, ws2; README recipe: one session, 3 runs each) into a
temporary directory, then runs SESSIONS judged sessions per class with one fault injected
(``SCALEGUARD_INJECT_FAULT``) and reads the ws2 case's verdict and the cause its story names:

- none: unmodified (the count of false alarms);
- comm: ``commdelay`` (every bucket's all-reduce waits MS: the collective got slower);
- straggler: ``slow,rank=1,at=backward`` (one rank computes MS more);
- compute: ``slow,at=backward`` (every rank computes MS more);
- rest: ``slow,rank=1,at=step,pct=PCT`` (one rank busy PCT % of its step outside its compute and
  the collective, after every step: the others wait; what "overlap lost or waiting" covers on
  CPU, where gloo has no overlap to lose).

Usage: python benchmarks/scaling_causes.py SESSIONS OUTDIR [--case transformer_tiny] [--ms 10] [pytest...]

Further arguments go to pytest, e.g. the local Slurm's (``tools/local_slurm.sh start``, its
SLURM_CONF exported): ``--perf-slurm --perf-device cpu --perf-slurm-ranks-per-node 1
--perf-slurm-nodes 1,2`` (world sizes 1 and 2 on one and two nodes; the fault reaches every
node's ranks through the environment srun passes on). Run it alone (two shared cores).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLASSES = {
    "none": None,
    "comm": "commdelay,ms={ms}",
    "straggler": "slow,rank=1,at=backward,ms={ms}",
    "compute": "slow,at=backward,ms={ms}",
    "rest": "slow,rank=1,at=step,pct={pct}",
}
EXPECTED = {
    "none": None,
    "comm": "communication got slower",
    "straggler": "a straggler",
    "compute": "slower compute on every rank",
    "rest": "overlap lost or waiting",
}


def pytest_args(model: str, baselines: Path, saved: Path, extra: list[str]) -> list[str]:
    # on a cluster the nodes and ranks per node set the world sizes
    sizes = [] if "--perf-slurm" in extra else ["--perf-world-sizes", "1,2"]
    return [
        sys.executable, "-m", "pytest", "perf/test_train_step.py", "-q", "-p", "no:cacheprovider",
        "--perf-models", model, "--perf-modes", "ddp", "--perf-scaling", "strong", *sizes,
        "--perf-inject-faults", "--perf-threads-per-rank", "1", "--perf-no-history",
        f"--perf-baselines={baselines}", f"--benchmark-json={saved}", *extra,
    ]  # fmt: skip


def run(cmd: list[str], env_fault: str | None, log: Path) -> None:
    import os

    env = dict(os.environ)
    env.pop("SCALEGUARD_INJECT_FAULT", None)
    if env_fault:
        env["SCALEGUARD_INJECT_FAULT"] = env_fault
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    log.write_text(proc.stdout + proc.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sessions", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--case", default="transformer_tiny")
    parser.add_argument("--ms", type=float, default=10.0)
    parser.add_argument("--pct", type=float, default=30.0, help="the rest class: busy percent of the step")
    parser.add_argument("--classes", default=",".join(CLASSES))
    args, extra = parser.parse_known_args()
    out: Path = args.out
    baselines = out / "baselines"
    baselines.mkdir(parents=True, exist_ok=True)
    if not any(baselines.iterdir()):
        started = time.monotonic()
        record = [*pytest_args(args.case, baselines, out / "record.json", extra), "--perf-update-baselines"]
        run([*record, "--perf-repeats", "3"], None, out / "record.log")
        if not any(baselines.iterdir()):
            raise SystemExit("the recording session recorded no baseline; record.log ends:\n"
                             + (out / "record.log").read_text(errors="replace")[-2000:])  # fmt: skip
        print(f"baseline recorded in {time.monotonic() - started:.0f} s", flush=True)
    counts: dict[str, Counter[str]] = {}
    for name in args.classes.split(","):
        fault = CLASSES[name]
        for index in range(args.sessions):
            saved = out / f"{name}{index}.json"
            started = time.monotonic()
            injected = fault.format(ms=args.ms, pct=args.pct) if fault else None
            log = out / f"{name}{index}.log"
            saved.unlink(missing_ok=True)  # a session that saves nothing must not read an older one
            run(pytest_args(args.case, baselines, saved, extra), injected, log)
            if not saved.is_file():
                raise SystemExit(f"{name} {index}: the session saved nothing; its log ({log}) ends:\n"
                                 + log.read_text(errors="replace")[-2000:])  # fmt: skip
            infos = {
                b["extra_info"]["case_id"]: b["extra_info"]
                for b in json.loads(saved.read_text())["benchmarks"]
            }
            ws2 = next(i for cid, i in infos.items() if "-ws2-" in cid)
            story = ws2.get("verdict_story", "")
            match = re.search(r"cause: ([^(]+?) \(", story)
            label = f"{ws2.get('verdict')} / {match.group(1) if match else 'no cause named'}"
            counts.setdefault(name, Counter())[label] += 1
            print(f"{name} {index}: {label} ({time.monotonic() - started:.0f} s)", flush=True)
    print("\nclass      expected                         outcomes")
    for name, counter in counts.items():
        right = sum(n for label, n in counter.items() if EXPECTED[name] and EXPECTED[name] in label)
        if EXPECTED[name] is None:
            right = sum(n for label, n in counter.items() if not label.startswith("REGRESSED"))
        total = sum(counter.values())
        print(f"{name:10} {EXPECTED[name] or 'no regression':32} {right}/{total} right: {dict(counter)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
