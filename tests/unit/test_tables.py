"""The session's scaling table: every judged row says how far it moved and what it could call,
and no header is cut at the width a CI log gets."""

from __future__ import annotations

import json
import re

import pytest

from scaleguard.evidence.ledger import Ledger
from scaleguard.evidence.verdict import Status, Thresholds, decide
from scaleguard.report import terminal
from tests.conftest import tiny_spec
from tests.unit.test_verdicts import case, runs_of


def _ledger() -> Ledger:
    """ws1 and ws2 of one group: ws1 drifted +1.6 % and is OK, ws2 lost 20 points."""
    ledger = Ledger("tonight")
    ws1, ws2 = tiny_spec(world_size=1, mode="ddp"), tiny_spec(world_size=2)
    for spec, medians in ((ws1, [0.1016] * 3), (ws2, [0.1016 / 0.7 * 2 / 2] * 3)):
        for run in runs_of(medians, sessions=1):
            ledger.add(spec, run)
    thr = Thresholds.for_device("cpu")
    old1 = case(runs_of([0.1] * 6, sessions=2), ws=1)
    ledger.verdicts[ws1.case_id] = decide(ledger.evidence(ws1.case_id), _as(old1, ledger, ws1.case_id), thr)
    old2 = case(runs_of([0.1 / 0.9] * 6, sessions=2, eff=0.9), ws=2)
    ledger.verdicts[ws2.case_id] = decide(ledger.evidence(ws2.case_id), _as(old2, ledger, ws2.case_id), thr)
    return ledger


def _as(old, ledger: Ledger, case_id: str):  # type: ignore[no-untyped-def]
    """The synthetic baseline under the live case's id and configuration."""
    from dataclasses import replace

    new = ledger.evidence(case_id)
    return replace(old, case_id=case_id, group_id=new.group_id, config=new.config, versions=new.versions)


@pytest.mark.parametrize(("width", "fit"), [(100, False), (100, True), (80, True)])
def test_no_header_is_cut_and_every_judged_row_says_how_far_it_moved(width: int, fit: bool) -> None:
    ledger = _ledger()
    text = terminal.render(terminal.scaling_tables(ledger), width, fit=fit)
    assert "…" not in text, text
    header = "\n".join(line for line in text.splitlines()[:8] if "┃" in line)
    words = " ".join(re.findall(r"[^┃\s]+", header))
    for column in terminal.COLUMNS:
        for word in column.split():
            assert word in words, (column, header)
    ws1 = ledger.verdicts[tiny_spec(world_size=1, mode="ddp").case_id]
    assert ws1.status is Status.OK
    # the OK row's drift shows, with the smallest change it could have called
    assert ws1.step is not None and 0.01 < ws1.step.change < 0.03
    ok_row = next(line for line in text.splitlines() if line.rstrip().endswith("OK │"))
    assert f"{ws1.step.change:+.1%}" in ok_row and f"{ws1.needed_step:.1%}" in ok_row, ok_row
    # the ws2 row carries its efficiency's change in points (a row may wrap at its spaces)
    flat = re.sub(r"[│\s]+", " ", text)
    ws2 = ledger.verdicts[tiny_spec(world_size=2).case_id]
    assert ws2.efficiency is not None and f"{ws2.efficiency.change * 100:+.1f}" in flat.replace(
        "p t", "pt"
    ), text


def test_the_saved_json_holds_the_tables_figures() -> None:
    from scaleguard.evidence.benchmark_io import extra_info

    ledger = _ledger()
    spec = tiny_spec(world_size=1, mode="ddp")
    verdict = ledger.verdicts[spec.case_id]
    info = extra_info(spec, ledger.evidence(spec.case_id), verdict, None)
    moved = info["vs_baseline"]
    assert verdict.step is not None and moved["step_change"] == verdict.step.change
    assert json.loads(json.dumps(info))["vs_baseline"] == moved  # plain JSON, as pytest-benchmark saves it
    assert moved["step_needed"] == verdict.needed_step and moved["efficiency_change"] is None
    spec2 = tiny_spec(world_size=2)
    info2 = extra_info(spec2, ledger.evidence(spec2.case_id), ledger.verdicts[spec2.case_id], None)
    assert info2["vs_baseline"]["efficiency_change"] < -0.15
