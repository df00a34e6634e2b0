"""How often the efficiency gate calls a drop against a young (one-session) baseline, by draws.

Each draw is a recording session of 3 runs per case and a judged session, both driven through
the suite's own schedule (``schedule.session.PerfSession``: one run, confirm runs in blocks
while the ws2 case is unsettled, each block beside runs of its ws1 reference), ledger (the
efficiency of each run against the session's ws1 runs) and verdict engine, with a fake launcher
in place of the ranks. The ws2 runs' efficiencies are drawn from two levels: a session's own
offset (sd ``--session``) shared by its runs and each run's own spread (sd ``--run``), around
``--mean``; the judged session's are ``--drop`` points lower (0: an A/A). Each draw is judged
with the CPU thresholds under the two-level rule and under the single-level rule (the device's
two levels switched off), on the same efficiencies. The default components are the ones
measured on the 2-core VM (docs/measured.md, "efficiency as two levels"); a rate here is a
model's, the sessions' counts are the evidence.

    python benchmarks/efficiency_rule_sim.py --draws 1000 --drop 0.15
    python benchmarks/efficiency_rule_sim.py --draws 3000 --drop 0
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from scaleguard.case import CaseSpec, RunSettings
from scaleguard.evidence.baseline import BaselineFile
from scaleguard.evidence.ledger import BaselineContext, Ledger
from scaleguard.evidence.records import RankResult
from scaleguard.evidence.runs import RunRecord
from scaleguard.evidence.verdict import Thresholds
from scaleguard.schedule.session import PerfSession, Schedule

WS1_STEP_S = 0.050  # every ws1 run alike: the drawn spread is the ws2 runs' efficiency


def _spec(world_size: int) -> CaseSpec:
    return CaseSpec(
        model="transformer_tiny", mode="ddp", world_size=world_size, precision="fp32", scaling="strong",
        inputs="synthetic", device="cpu", profile="smoke", global_batch=32,
        settings=RunSettings(steps=10, warmup_min=2, warmup_max=4, warmup_tolerance=0.5, threads_per_rank=1),
    )  # fmt: skip


WS1, WS2 = _spec(1), _spec(2)


def _record(spec: CaseSpec, step_s: float) -> RunRecord:
    steps = tuple(step_s for _ in range(spec.settings.steps))
    rank = RankResult(spec.case_id, 0, steps, (), True, 0.1, 1000, "host_max_rss", "cpu", {"torch": "t"}, {})
    return RunRecord.from_ranks(spec, [rank])


def _ws2_step(efficiency: float) -> float:
    """The ws2 step whose rate over ws1's, per rank, is ``efficiency`` (strong scaling)."""
    return WS1_STEP_S / (WS2.world_size * efficiency)


class Launcher:
    """Hands out the drawn ws2 steps in order; ws1 runs all take ``WS1_STEP_S``."""

    def __init__(self, ws2_effs: np.ndarray) -> None:
        self.effs = list(ws2_effs)

    def __call__(self, spec: CaseSpec, run_dir: Path, timeout_s: float) -> RunRecord:
        if spec.world_size == 1:
            return _record(spec, WS1_STEP_S)
        return _record(spec, _ws2_step(self.effs.pop(0)))


def _baseline(effs: np.ndarray, thr: Thresholds, where: Path) -> BaselineContext:
    recording = Ledger("old", None)
    for eff in effs:
        recording.add(WS1, _record(WS1, WS1_STEP_S), session="old")
        recording.add(WS2, _record(WS2, _ws2_step(float(eff))), session="old")
    ctx = BaselineContext(where / "b.json", None, "k", {}, thresholds=thr)
    ctx.file = BaselineFile(ctx.path, "k", {}).merged(
        [recording.evidence(WS1.case_id), recording.evidence(WS2.case_id)]
    )
    return ctx


def judged(old: np.ndarray, new: np.ndarray, thr: Thresholds, where: Path) -> str:
    """The ws2 verdict of one judged session as the suite schedules it."""
    ledger = Ledger("now", _baseline(old, thr, where))
    perf = PerfSession(
        ledger, where, 60, Schedule(repeats=1, confirm=4), run=Launcher(new), sleep=lambda s: None
    )
    perf.measure(WS1)
    verdict = perf.measure(WS2)
    assert verdict is not None
    return verdict.status.value


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--drop", type=float, default=0.15, help="points the judged session loses (0: A/A)")
    parser.add_argument("--mean", type=float, default=0.85)
    parser.add_argument("--session", type=float, default=0.028, help="sd of a session's offset")
    parser.add_argument("--run", type=float, default=0.041, help="sd of a run around its session")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    two = Thresholds.for_device("cpu")
    one = dataclasses.replace(two, eff_session_spread=0.0, eff_run_spread=0.0)
    counts: dict[str, Counter[str]] = {"two levels": Counter(), "one level": Counter()}
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        for _ in range(args.draws):
            old = args.mean + rng.normal(0, args.session) + rng.normal(0, args.run, 3)
            # enough runs for the first and every confirm run the schedule may buy (1 + 4)
            new = args.mean - args.drop + rng.normal(0, args.session) + rng.normal(0, args.run, 5)
            counts["two levels"][judged(old, new, two, where)] += 1
            counts["one level"][judged(old, new, one, where)] += 1
    print(
        f"{args.draws} draws, drop {args.drop * 100:.0f} points, mean {args.mean}, session sd "
        f"{args.session * 100:.1f}, run sd {args.run * 100:.1f} (one-session baseline of 3 runs)"
    )
    for rule, counter in counts.items():
        share = {k: f"{v / args.draws:.1%}" for k, v in sorted(counter.items())}
        print(f"  {rule}: {share}")


if __name__ == "__main__":
    main()
