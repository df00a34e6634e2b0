"""How far the DDP (or FSDP) projection lands from the measured scaling efficiency, over sessions.

Runs SESSIONS sessions of the default DDP cases (`pytest perf/ -k ddp`; with `--perf-modes fsdp`
among the pytest arguments, the FSDP cases, `-k fsdp`), every case NEW against an
empty baseline directory so no confirm runs are bought), reads each session's saved
pytest-benchmark JSON, and prints per case and overall: projected vs measured efficiency, the
error in points (median and worst), and the same errors had the projection assumed the other
overlap rule (recomputed from the stored inputs), so the rule the device table picks is shown
against its alternative. Extra arguments go to pytest (e.g. the local Slurm's options).

Usage: python benchmarks/projection_accuracy.py SESSIONS OUTDIR [pytest args...]
       python benchmarks/projection_accuracy.py --read OUTDIR   (summarise saved sessions only)
Run it alone: two cores shared with anything else measure that, not the model.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _mode(extra: list[str]) -> str:
    """The mode measured: ddp, or the one ``--perf-modes`` names (e.g. fsdp)."""
    if "--perf-modes" in extra and extra.index("--perf-modes") + 1 < len(extra):
        return extra[extra.index("--perf-modes") + 1]
    return "ddp"


def run_sessions(count: int, out: Path, extra: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        saved = out / f"session{index}.json"
        with tempfile.TemporaryDirectory() as empty:
            started = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "perf/", "-k", _mode(extra), "-q", "-p", "no:cacheprovider",
                 "--perf-no-history", f"--perf-baselines={empty}", f"--benchmark-json={saved}", *extra],
                cwd=ROOT, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
        (out / f"session{index}.log").write_text(proc.stdout + proc.stderr)
        print(f"session {index}: exit {proc.returncode}, {time.monotonic() - started:.0f} s", flush=True)


def summarise(out: Path) -> int:
    from scaleguard.devices import defaults_for
    from scaleguard.evidence.projection import project
    from scaleguard.evidence.runs import RunRecord

    rows: dict[str, list[tuple[float, float, float]]] = {}
    for saved in sorted(out.glob("session*.json")):
        infos = {
            b["extra_info"]["case_id"]: b["extra_info"] for b in json.loads(saved.read_text())["benchmarks"]
        }
        for case_id, info in infos.items():
            projected = info.get("projection")
            if not projected or info.get("scaling_efficiency") is None:
                continue
            ws1 = infos.get(case_id.replace(f"-ws{info['world_size']}-", "-ws1-"))
            if ws1 is None:
                continue
            # recomputed from the stored inputs with this checkout's model: a change of the
            # model is judged on the same sessions
            runs1 = [RunRecord.from_dict(r, "ws1", "") for r in ws1["runs"]]
            runsn = [RunRecord.from_dict(r, "wsn", "") for r in info["runs"]]
            rule = defaults_for(info["device"]).comm_overlaps
            chosen, other = (
                project(
                    runs1, runsn, ws1["per_rank_batch"], info["per_rank_batch"], info["world_size"],
                    ws1["global_batch"], info["global_batch"], overlap,
                )
                for overlap in (rule, not rule)
            )  # fmt: skip
            if chosen is None or other is None:
                continue
            rows.setdefault(case_id, []).append(
                (info["scaling_efficiency"], chosen.efficiency, other.efficiency)
            )
    if not rows:
        print("no projected case in", out)
        return 1
    print(f"{'case':45} n  measured  projected  err(pt) median/worst  other rule err median/worst")
    errors, others = [], []
    for case_id, values in sorted(rows.items()):
        err = [(p - m) * 100 for m, p, _ in values]
        oth = [(o - m) * 100 for m, _, o in values]
        errors += err
        others += oth
        print(
            f"{case_id:45} {len(values)}  {statistics.median(m for m, _, _ in values):.3f}     "
            f"{statistics.median(p for _, p, _ in values):.3f}      {statistics.median(err):+6.1f} / "
            f"{max(err, key=abs):+6.1f}        {statistics.median(oth):+6.1f} / {max(oth, key=abs):+6.1f}"
        )
    absolute = [abs(e) for e in errors]
    print(
        f"all {len(errors)} projections: |error| median {statistics.median(absolute):.1f} points, worst "
        f"{max(absolute):.1f}; the other overlap rule: median "
        f"{statistics.median(abs(e) for e in others):.1f}, worst {max(abs(e) for e in others):.1f}"
    )
    return 0


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--read":
        return summarise(Path(sys.argv[2]))
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    out = Path(sys.argv[2])
    run_sessions(int(sys.argv[1]), out, sys.argv[3:])
    return summarise(out)


if __name__ == "__main__":
    raise SystemExit(main())
