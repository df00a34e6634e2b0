"""The DDP projection: its overlap rule, the slowest-rank factor, the whole projection on
synthetic runs, and the stored inputs' reader."""

from __future__ import annotations

import dataclasses

import pytest

from scaleguard.evidence.files import FileFormatError
from scaleguard.evidence.projection import ScalingInputs, expected_max, exposed_ms, project
from tests.unit.test_verdicts import run

PHASES = {"data": 0.0, "forward": 30.0, "backward": 60.0, "optimizer": 10.0}


def test_buckets_hide_under_the_backward_until_the_last_one() -> None:
    # three 10 ms buckets ready at 20 %, 50 % and 100 % of a 100 ms backward: the first two
    # hide, the last starts at the end and is exposed whole
    assert exposed_ms(100.0, [0.2, 0.5, 1.0], [0.010, 0.010, 0.010], overlap=True) == pytest.approx(10.0)
    # a bucket queue longer than the backward: 3 x 50 ms from 10 % on ends at 160 ms
    assert exposed_ms(100.0, [0.1, 0.1, 0.1], [0.05, 0.05, 0.05], overlap=True) == pytest.approx(60.0)
    # gloo on CPU: nothing hides
    assert exposed_ms(100.0, [0.2, 0.5, 1.0], [0.010, 0.010, 0.010], overlap=False) == pytest.approx(30.0)


def test_the_slowest_of_n_ranks_costs_the_jitter_of_one() -> None:
    steady = [1.0] * 50
    assert expected_max(steady, 8) == pytest.approx(1.0)
    two_valued = [1.0] * 25 + [2.0] * 25  # max of 2 draws is 2 unless both draw 1 (1/4)
    assert expected_max(two_valued, 2) == pytest.approx((0.25 * 1 + 0.75 * 2) / 1.5)
    assert expected_max(two_valued, 1) == 1.0


def _with(inputs: ScalingInputs, median: float, seed: int) -> object:
    return dataclasses.replace(run(median, seed=seed, within=0.0), scaling=inputs)


def test_a_projection_from_ws1_compute_and_the_measured_all_reduce() -> None:
    # ws1: 100 ms step = 100 ms of phases; at the half batch, 55 ms of compute (not 50: a
    # small batch is less efficient, measured rather than assumed)
    half = {"data": 0.0, "forward": 17.0, "backward": 33.0, "optimizer": 5.0}
    one = ScalingInputs(phase_ms=PHASES, ready=(1.0, 0.5), phase_ms_at={32: half})
    many = ScalingInputs(
        phase_ms=half, ready=(1.0, 0.5), buckets=((4000, (1,)), (4000, (0,))), bucket_s=(0.005, 0.005)
    )
    ws1 = [_with(one, 0.100, seed=i) for i in range(3)]
    ws2 = [_with(many, 0.070, seed=10 + i) for i in range(3)]
    projected = project(ws1, ws2, 64, 32, 2, 64, 64, overlap=True)
    assert projected is not None
    assert projected.compute_ms == pytest.approx(55.0, rel=1e-6)
    # bucket of parameter 1 ready at 50 % of the 33 ms backward, then parameter 0's at the end
    assert projected.exposed_ms == pytest.approx(5.0, rel=1e-6)
    assert projected.efficiency == pytest.approx(100.0 / (2 * 60.0), rel=1e-6)
    serial = project(ws1, ws2, 64, 32, 2, 64, 64, overlap=False)
    assert serial is not None and serial.exposed_ms == pytest.approx(10.0)
    # weak scaling, no measurement at another batch: the phases as they are
    weak = project(ws1, ws2, 64, 64, 2, 64, 128, overlap=True)
    assert weak is not None and weak.compute_ms == pytest.approx(100.0, rel=1e-6)
    # no inputs on either side: no projection
    assert project([run(0.1)], ws2, 64, 32, 2, 64, 64, overlap=True) is None
    assert project(ws1, [run(0.07)], 64, 32, 2, 64, 64, overlap=True) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"phase_ms": {"forward": 1.0}},
        {"phase_ms": PHASES, "ready": [2.0]},
        {"phase_ms": PHASES, "buckets": [[10, [0]]], "bucket_s": []},
        {"phase_ms": PHASES, "buckets": [["10", [0]]], "bucket_s": [0.1]},
        {"phase_ms": PHASES, "buckets": [[10, [-1]]], "bucket_s": [0.1]},
        {"phase_ms": PHASES, "phase_ms_at": {"9" * 5000: PHASES}},
        {"phase_ms": PHASES, "phase_ms_at": {"x": PHASES}},
        {"phase_ms": {**PHASES, "forward": float("nan")}},
    ],
)
def test_stored_inputs_that_do_not_make_sense_are_refused(bad: dict) -> None:
    with pytest.raises(FileFormatError):
        ScalingInputs.from_dict(bad, "run.scaling", "fix it")


def test_stored_inputs_round_trip() -> None:
    inputs = ScalingInputs(
        phase_ms=PHASES, ready=(0.5, 1.0), phase_ms_at={16: PHASES}, buckets=((8, (1, 0)),), bucket_s=(0.01,)
    )
    assert ScalingInputs.from_dict(inputs.to_dict(), "x", "y") == inputs


def _projected(efficiency: float) -> object:
    from scaleguard.evidence.projection import Projection

    return Projection(
        world_size=2, step_ms=50.0, efficiency=efficiency, compute_ms=48.0, backward_ms=30.0, comm_ms=2.0,
        exposed_ms=2.0, buckets=1, ws1_step_ms=100.0, overlap=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("effs", "projected", "expected"),
    [
        # 30 points below with runs that agree: called
        ([0.60, 0.61, 0.60], 0.90, "BELOW-PROJECTION"),
        # one run, far below: called provisionally (its confirm runs settle it)
        ([0.60], 0.90, "BELOW-PROJECTION"),
        # 8 points below on CPU, whose projection errs by up to 10: not called
        ([0.82, 0.82], 0.90, "NEW"),
        # 20 points below but the runs themselves spread 10 points (3 sigma 30): not called
        ([0.60, 0.80, 0.70], 0.90, "NEW"),
        # at or above the projection: nothing to say
        ([0.95, 0.95], 0.90, "NEW"),
    ],
)
def test_a_case_well_below_its_projection_is_called_without_a_baseline(
    effs: list[float], projected: float, expected: str
) -> None:
    from scaleguard.evidence.verdict import Status, Verdict, against_projection
    from tests.unit.test_verdicts import case

    new = case([run(0.05, seed=i, eff=e) for i, e in enumerate(effs)], ws=2)
    verdict = against_projection(Verdict(new.case_id, Status.NEW, "NEW"), new, _projected(projected), 0.10)
    assert verdict.status.value == expected, verdict.story
    if expected == "BELOW-PROJECTION":
        assert f"vs {projected:.2f} projected from ws1" in verdict.story
        assert ("sigma unknown (1 run)" in verdict.story) is (len(effs) == 1)
    # a case its baseline already faults keeps that verdict (its own story names the cause)
    regressed = Verdict(new.case_id, Status.REGRESSED, "REGRESSED")
    assert against_projection(regressed, new, _projected(projected), 0.10) is regressed


def _ddp_runs(step_ms: float, ranks: tuple[float, ...], bucket_s: tuple[float, ...], seed: int) -> list:
    phases = {"data": 0.0, "forward": 15.0, "backward": 30.0, "optimizer": 5.0}
    inputs = ScalingInputs(
        phase_ms=phases, ready=(0.5, 1.0), buckets=((4000, (1,)), (4000, (0,))), bucket_s=bucket_s,
        rank_compute_ms=ranks,
    )  # fmt: skip
    return [_with(inputs, step_ms / 1e3, seed=seed + i) for i in range(3)]


@pytest.mark.parametrize(
    ("after", "named"),
    [
        # the all-reduce alone took 2 x 10 ms, now 2 x 20: 20 ms of a 20 ms change on CPU
        (dict(step_ms=90.0, ranks=(50.0, 50.0), bucket_s=(0.020, 0.020)), "communication got slower"),
        # rank 1 alone computes 20 ms more
        (dict(step_ms=90.0, ranks=(50.0, 70.0), bucket_s=(0.010, 0.010)), "a straggler"),
        # every rank computes 20 ms more
        (dict(step_ms=90.0, ranks=(70.0, 70.0), bucket_s=(0.010, 0.010)), "slower compute on every rank"),
        # neither moved, the step did: overlap lost or waiting
        (dict(step_ms=90.0, ranks=(50.0, 50.0), bucket_s=(0.010, 0.010)), "overlap lost or waiting"),
        # a bit of each: nothing explains more than half
        (dict(step_ms=90.0, ranks=(57.0, 57.0), bucket_s=(0.0135, 0.0135)), None),
    ],
)
def test_a_scaling_change_is_split_by_counterfactual_and_named_past_half(
    after: dict, named: str | None
) -> None:
    from scaleguard.evidence.projection import explain

    before = _ddp_runs(70.0, (50.0, 50.0), (0.010, 0.010), seed=0)
    cause = explain(before, _ddp_runs(seed=10, **after), overlap=False)
    assert cause is not None
    assert cause.gap_ms == pytest.approx(20.0, rel=1e-6)
    assert cause.compute_ms + cause.comm_ms + cause.rest_ms == pytest.approx(cause.gap_ms)
    assert (cause.named or "").startswith(named or "") and (cause.named is None) is (named is None)
    text = cause.describe("step")
    assert ("rank 1 computes 20.0 ms/step more" in text) is (named == "a straggler"), text


def _placed(ranks: int, threads: int, host_cores: int, hosts: int = 1) -> dict:
    return {
        str(r): {"node": f"n{r}", "host": f"box{r % hosts}", "host_cores": host_cores, "threads": threads}
        for r in range(ranks)
    }


@pytest.mark.parametrize(
    ("placement", "withheld"),
    [
        (_placed(2, 1, 2), False),  # two ranks of one thread on two cores: each computes at once
        (_placed(4, 1, 2), True),  # four "nodes" of one host: they take turns
        (_placed(2, 2, 2), True),  # two threads each on two cores
        (_placed(4, 1, 2, hosts=2), False),  # two hosts of two cores, two ranks each
        ({}, False),  # an older run without hosts: projected as before
    ],
)
def test_ranks_that_time_share_a_hosts_cores_are_not_projected(placement: dict, withheld: bool) -> None:
    from scaleguard.evidence.ledger import Ledger
    from scaleguard.evidence.projection import time_shared
    from tests.conftest import tiny_spec

    said = time_shared(placement)
    assert (said is not None) is withheld
    ledger = Ledger("s")
    spec = tiny_spec(world_size=2)
    ledger.add(spec, dataclasses.replace(run(0.05, seed=2), placement=placement))
    assert ledger.projection_withheld(spec.case_id) == said
    if said is not None:
        assert "time-share the 2 cores of box0" in said and ledger.projection(spec.case_id) is None


# FSDP2: its units' gathers and scatters, and what FSDP pays for them ------------------------------


def test_fsdp_units_gather_and_scatter_serially_on_cpu_and_pipelined_with_overlap() -> None:
    from scaleguard.evidence.projection import fsdp_exposed_ms

    units = ((1000, 1), (1000, 2), (1000, 2))  # the root (gathered once), two resharded blocks
    gather, scatter = (0.002, 0.002, 0.002), (0.003, 0.003, 0.003)
    # gloo on CPU: every gather (1 + 2 + 2) and every scatter (3) adds: 5 x 2 + 3 x 3 ms
    assert fsdp_exposed_ms(30.0, 60.0, units, gather, scatter, overlap=False) == pytest.approx(19.0)
    # with overlap, long compute: exposed are the forward's first gather, the backward's first
    # (the last block, resharded after forward, gathered again before anything can prefetch it)
    # and the root's scatter at the very end; the rest hide under compute
    hidden = fsdp_exposed_ms(300.0, 600.0, units, gather, scatter, overlap=True)
    assert hidden == pytest.approx(2.0 + 2.0 + 3.0)
    # collectives far longer than the compute: nearly all of them exposed, never more than serial
    slow = fsdp_exposed_ms(0.3, 0.6, units, (0.05,) * 3, (0.05,) * 3, overlap=True)
    assert 0.9 * 400.0 <= slow <= 400.0
    # no overlap ever beats overlap
    for fwd, bwd in ((1.0, 2.0), (10.0, 20.0), (100.0, 200.0)):
        assert fsdp_exposed_ms(fwd, bwd, units, gather, scatter, True) <= fsdp_exposed_ms(
            fwd, bwd, units, gather, scatter, False
        )


def _fsdp(
    phases: dict, at: dict, units: tuple = (), seconds: float = 0.001, ranks: tuple = ()
) -> ScalingInputs:
    n = len(units)
    return ScalingInputs(
        phase_ms=phases, phase_ms_at=at, units=units, gather_s=(seconds,) * n, scatter_s=(seconds,) * n,
        rank_compute_ms=ranks,
    )  # fmt: skip


def test_an_fsdp_projection_charges_what_fsdp_pays_at_n_and_shards_the_optimizer() -> None:
    half = {"data": 0.0, "forward": 15.0, "backward": 30.0, "optimizer": 10.0}
    tiny = {"data": 0.0, "forward": 2.0, "backward": 3.0, "optimizer": 10.0}  # ws1 at 2 samples
    tiny_n = {"data": 0.0, "forward": 6.0, "backward": 11.0, "optimizer": 5.0}  # N's at 2: +4, +8; opt halved
    units = ((1000, 1), (2000, 2))
    ws1 = [_with(_fsdp(PHASES, {32: half, 2: tiny}), 0.100, seed=i) for i in range(3)]
    ws2 = [_with(_fsdp(half, {2: tiny_n}, units, seconds=0.0005), 0.075, seed=10 + i) for i in range(3)]
    projected = project(ws1, ws2, 64, 32, 2, 64, 64, overlap=False)
    assert projected is not None and projected.mode == "fsdp" and projected.buckets == 2
    # compute at 32 with N's sharded optimizer (5, measured), collectives as paid: 4 + 8 ms
    assert projected.compute_ms == pytest.approx(15.0 + 30.0 + 5.0, rel=1e-6)
    assert projected.exposed_ms == pytest.approx(12.0) and projected.comm_ms == pytest.approx(12.0)
    assert projected.efficiency == pytest.approx(100.0 / (2 * 62.0), rel=1e-6)
    assert "of 2 FSDP units 12.0 ms as FSDP pays them (a small step at ws2 less ws1's)" in projected.describe(
        0.7
    )
    # runs from before the probe (no small batch at N): the collectives alone, optimizer / N
    older = [_with(_fsdp(half, {}, units, seconds=0.0005), 0.075, seed=20 + i) for i in range(3)]
    alone = project(ws1, older, 64, 32, 2, 64, 64, overlap=False)
    assert alone is not None and alone.compute_ms == pytest.approx(15.0 + 30.0 + 5.0, rel=1e-6)
    assert alone.exposed_ms == pytest.approx((1 + 2) * 0.5 + 2 * 0.5)
    # another unit layout in one of N's runs: not one model, no projection
    mixed = [*ws2[:2], _with(_fsdp(half, {2: tiny_n}, ((1000, 1),)), 0.075, seed=30)]
    assert project(ws1, mixed, 64, 32, 2, 64, 64, overlap=False) is None


def test_fsdp_inputs_round_trip_and_bad_units_are_refused() -> None:
    inputs = _fsdp(PHASES, {2: PHASES}, ((4096, 1), (8192, 2)), ranks=(10.0, 11.0))
    assert ScalingInputs.from_dict(inputs.to_dict(), "x", "y") == inputs
    for bad in (
        {"phase_ms": PHASES, "units": [[10, 3]], "gather_s": [0.1], "scatter_s": [0.1]},  # gathered 3 times
        {"phase_ms": PHASES, "units": [[0, 1]], "gather_s": [0.1], "scatter_s": [0.1]},  # no bytes
        {"phase_ms": PHASES, "units": [[10, 1]], "gather_s": [], "scatter_s": [0.1]},  # a time missing
        {"phase_ms": PHASES, "units": [[10, 1]], "gather_s": [0.1], "scatter_s": [-1.0]},
        {"phase_ms": PHASES, "units": [[True, 1]], "gather_s": [0.1], "scatter_s": [0.1]},
    ):
        with pytest.raises(FileFormatError):
            ScalingInputs.from_dict(bad, "run.scaling", "fix it")


def test_an_fsdp_scaling_change_is_split_with_its_collectives() -> None:
    from scaleguard.evidence.projection import explain

    units = ((1000, 1), (2000, 2))

    def runs(seconds: float, ranks: tuple, step_ms: float, seed: int) -> list:
        inputs = _fsdp(
            {"data": 0.0, "forward": 15.0, "backward": 30.0, "optimizer": 5.0}, {}, units, seconds, ranks
        )
        return [_with(inputs, step_ms / 1e3, seed=seed + i) for i in range(3)]

    old = runs(0.001, (50.0, 50.0), 56.0, 0)
    slower = explain(old, runs(0.011, (50.0, 50.0), 106.0, 10), overlap=False)  # 5 x 10 ms more
    assert slower is not None and slower.named == "communication got slower"
    assert slower.comm_ms == pytest.approx(50.0) and "all-gather/reduce-scatter alone" in slower.describe(
        "step"
    )
    straggler = explain(old, runs(0.001, (50.0, 90.0), 96.0, 20), overlap=False)
    assert straggler is not None and straggler.named == "a straggler" and straggler.straggler == (1, 40.0)
