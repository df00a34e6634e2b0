"""The scaling efficiency's own spread between sessions, and the efficiency gate's power.

    python benchmarks/efficiency_power.py spread --work /tmp/eff --sessions 10
    python benchmarks/efficiency_power.py power --work /tmp/eff --trials 10 --baseline-sessions 1
    python benchmarks/efficiency_power.py power --work /tmp/eff --trials 10 --baseline-sessions 2
    python benchmarks/efficiency_power.py power --work /tmp/eff --baseline-sessions 2 --fault slow,rank=1,at=step,pct=21

``spread``: identical sessions of ``transformer_tiny`` ddp strong ws1+ws2 (gloo, 1 thread per
rank, as the README's main command plans them on a laptop), each session's ws2 efficiency and
their standard deviation in points: the figure ``devices.DeviceDefaults.eff_prior_spread``
stands for. ``power``: records a baseline as the README says (``--perf-repeats 3``, in
``--baseline-sessions`` sessions), then judges ``--trials`` unmodified sessions (false alarms)
and ``--trials`` sessions in which rank 1 alone computes ``--straggler-ms`` more at the start of
every backward (a straggler: the others wait for it), and counts the ws2 verdicts. Run it alone
on the machine: it is a timing measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE = "transformer_tiny-ddp-ws2-fp32-strong"
ARGS = [
    "--perf-device", "cpu", "--perf-models", "transformer_tiny", "--perf-modes", "ddp",
    "--perf-scaling", "strong", "--perf-inputs", "synthetic", "--perf-threads-per-rank", "1",
    "--perf-no-history", "-p", "no:cacheprovider", "-p", "no:randomly", "-q",
]  # fmt: skip


def session(work: Path, name: str, baselines: Path, *extra: str, fault: str | None = None) -> dict[str, dict]:
    """One pytest session; each case's extra_info from its saved run."""
    storage = work / "bench"
    env = {k: v for k, v in os.environ.items() if k != "SCALEGUARD_INJECT_FAULT"}
    if fault:
        env["SCALEGUARD_INJECT_FAULT"] = fault
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "perf" / "test_train_step.py"), "--rootdir", str(work),
           *ARGS, f"--perf-baselines={baselines}", f"--benchmark-save={name}",
           f"--benchmark-storage=file://{storage}", "--perf-inject-faults", *extra]  # fmt: skip
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900, check=False)
    saved = sorted(storage.glob(f"*/*_{name}.json"))
    if not saved:
        raise SystemExit(f"session {name} saved nothing (exit {done.returncode}):\n{done.stdout[-3000:]}")
    out = {b["param"]: b["extra_info"] for b in json.loads(saved[-1].read_text())["benchmarks"]}
    stories = [
        line
        for line in done.stdout.splitlines()
        if CASE in line and ("REGRESSED" in line or "INCONCLUSIVE" in line)
    ]
    out[CASE]["_story"] = stories[0] if stories else ""
    return out


def spread(args: argparse.Namespace) -> None:
    work = args.work
    baselines = work / "none"
    baselines.mkdir(parents=True, exist_ok=True)
    effs = []
    for i in range(args.sessions):
        info = session(work, f"spread{i}", baselines)
        eff = info[CASE]["scaling_efficiency"]
        effs.append(eff)
        print(f"session {i}: ws2 efficiency {eff:.3f}", flush=True)
    print(
        f"ws2 efficiency over {len(effs)} sessions: median {statistics.median(effs):.3f}, "
        f"range {min(effs):.3f}-{max(effs):.3f}, standard deviation {statistics.stdev(effs) * 100:.1f} points"
    )


def power(args: argparse.Namespace) -> None:
    work = args.work / f"power-{args.baseline_sessions}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    baselines = work / "baselines"
    baselines.mkdir()
    for i in range(args.baseline_sessions):
        info = session(work, f"record{i}", baselines, "--perf-update-baselines", "--perf-repeats", "3")
        print(f"recorded session {i}: ws2 efficiency {info[CASE]['scaling_efficiency']:.3f}", flush=True)
    counts: dict[str, dict[str, int]] = {}
    fault = args.fault or f"slow,rank=1,at=backward,ms={args.straggler_ms}"
    for label, injected in (("unmodified", None), ("straggler", fault)):
        for i in range(args.trials):
            info = session(work, f"{label}{i}", baselines, fault=injected)[CASE]
            verdict = info.get("verdict", "?")
            counts.setdefault(label, {}).setdefault(verdict, 0)
            counts[label][verdict] += 1
            print(
                f"{label} {i}: ws2 {verdict}, efficiency {info['scaling_efficiency']:.3f}"
                + (f"\n    {info['_story'][:400]}" if info["_story"] else ""),
                flush=True,
            )
    print(
        f"baseline of {args.baseline_sessions} session(s) x 3 runs; fault {fault}; ws2 verdicts: {json.dumps(counts)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("spread")
    one.add_argument("--work", type=Path, required=True)
    one.add_argument("--sessions", type=int, default=10)
    two = sub.add_parser("power")
    two.add_argument("--work", type=Path, required=True)
    two.add_argument("--trials", type=int, default=10)
    two.add_argument("--baseline-sessions", type=int, default=1)
    two.add_argument("--straggler-ms", type=float, default=5.0)
    # a slowdown in proportion to rank 1's own step (``slow,rank=1,at=step,pct=21``) moves the
    # efficiency by the same factor in every session (e -> e / 1.21: 15 points from 0.85), where
    # a fixed number of milliseconds moved it 2-21 points as the step itself varied
    two.add_argument("--fault", help="the injected fault instead of the straggler (SCALEGUARD_INJECT_FAULT)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    spread(args) if args.what == "spread" else power(args)


if __name__ == "__main__":
    main()
