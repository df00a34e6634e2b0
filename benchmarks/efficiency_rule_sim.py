"""How often the efficiency gate calls a drop against a young (one-session) baseline, by draws.

Each draw is a baseline session of 3 runs and a judged session of 1 run plus confirm runs (as
``schedule.session`` buys them: blocks of 2 while the ws2 case is unsettled, at most 4), with
efficiencies drawn from two levels: a session's own offset (sd ``--session``) shared by its
runs, and each run's own spread (sd ``--run``), around ``--mean``. The judged session's
efficiency is ``--drop`` points lower (0: an A/A). Every verdict comes from the suite's own engine
(``evidence.verdict.decide``) with the CPU thresholds, under the two-level rule and under the
single-level rule (the device's two levels switched off), so the two are compared on the same
draws. The default components are the ones measured on the 2-core VM (docs/measured.md,
"efficiency as two levels"); a rate here is a model's, the sessions' counts are the evidence.

    python benchmarks/efficiency_rule_sim.py --draws 2000 --drop 0.15
    python benchmarks/efficiency_rule_sim.py --draws 2000 --drop 0
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from scaleguard.evidence.runs import CaseEvidence, RunRecord
from scaleguard.evidence.stats import StepSummary
from scaleguard.evidence.verdict import Status, Thresholds, decide

STEPS = tuple(0.030 for _ in range(10))


def _run(session: str, index: int, eff: float) -> RunRecord:
    return RunRecord(
        run_id=f"{session}-{index}",
        session=session,
        summary=StepSummary.of(STEPS),
        step_s=STEPS,
        samples_per_s=64 / 0.030,
        peak_mem_bytes=2**30,
        scaling_efficiency=float(eff),
        recorded_at=f"2026-01-01T00:00:{index:02d}",
    )


def _case(runs: list[RunRecord]) -> CaseEvidence:
    return CaseEvidence(
        case_id="m-ddp-ws2-fp32-strong",
        group_id="m-ddp-fp32-strong",
        world_size=2,
        config={"model": "m", "world_size": 2, "global_batch": 64},
        versions={"torch": "2.14.1"},
        runs=tuple(runs),
    )


_UNSETTLED = (Status.REGRESSED, Status.IMPROVED, Status.INCONCLUSIVE)


def judged(new_effs: list[float], base: CaseEvidence, thr: Thresholds) -> Status:
    """The session's schedule: the first run, then confirm blocks of 2 (at most 4) while the
    verdict is INCONCLUSIVE, or REGRESSED/IMPROVED before one block has repeated it."""
    runs = [_run("new", 0, new_effs[0])]
    verdict = decide(_case(runs), base, thr, ws1_status=Status.OK)
    extra = 0
    while verdict.status in _UNSETTLED and extra < 4:
        if verdict.status is not Status.INCONCLUSIVE and extra >= 2:
            break
        runs += [_run("new", 1 + extra + i, new_effs[1 + extra + i]) for i in range(2)]
        extra += 2
        verdict = decide(_case(runs), base, thr, ws1_status=Status.OK)
    return verdict.status


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--draws", type=int, default=2000)
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
    for _ in range(args.draws):
        old = args.mean + rng.normal(0, args.session) + rng.normal(0, args.run, 3)
        new = args.mean - args.drop + rng.normal(0, args.session) + rng.normal(0, args.run, 5)
        base = _case([_run("old", i, e) for i, e in enumerate(old)])
        counts["two levels"][judged(list(new), base, two).value] += 1
        counts["one level"][judged(list(new), base, one).value] += 1
    print(
        f"{args.draws} draws, drop {args.drop * 100:.0f} points, mean {args.mean}, session sd "
        f"{args.session * 100:.1f}, run sd {args.run * 100:.1f} (one-session baseline of 3 runs)"
    )
    for rule, counter in counts.items():
        share = {k: f"{v / args.draws:.1%}" for k, v in sorted(counter.items())}
        print(f"  {rule}: {share}")


if __name__ == "__main__":
    main()
