"""Step anatomy: its record, and the sentence that says what moved."""

from __future__ import annotations

import math

import pytest

from scaleguard.evidence.anatomy import Anatomy, OpTime, explain, summary
from scaleguard.evidence.files import FileFormatError


def anatomy(comm: float = 0.5, backward: float = 10.0, mm: float = 4.0) -> Anatomy:
    return Anatomy(
        ms={
            "data": 0.1,
            "forward": 5.0,
            "backward": backward,
            "optimizer": 1.0,
            "exposed communication": comm,
        },
        top_ops=(OpTime("aten::mm", 12, mm), OpTime("aten::addmm", 6, 2.0)),
        op_clock="cpu",
        steps=3,
        cost_s=0.4,
        trace="/tmp/run/trace.rank0.json",
    )


def test_a_delayed_all_reduce_is_named_communication_not_compute() -> None:
    text = explain([anatomy(), anatomy(comm=0.7)], [anatomy(comm=30.5), anatomy(comm=31.0)])
    assert text is not None and text.startswith("slower: exposed communication +30.")
    assert "backward" not in text and "top op" not in text  # compute did not move


def test_slower_backward_names_backward_and_the_op_that_grew() -> None:
    text = explain([anatomy()], [anatomy(backward=13.0, mm=7.0)])
    assert text == ("slower: backward +3.00 ms/step (10.00 -> 13.00); top op: aten::mm +3.00 ms/step (+75%)")


def test_device_time_no_op_launched_is_a_row_of_its_own_and_named_when_material() -> None:
    from types import SimpleNamespace as Event

    from scaleguard.evidence.anatomy import OUTSIDE_OPS
    from scaleguard.ranks.profiling import top_ops

    def cpu(key: str, device_us: float) -> Event:
        return Event(key=key, count=1, self_device_time_total=device_us, device_type="DeviceType.CPU")

    def kernel(key: str, device_us: float) -> Event:
        return Event(key=key, count=1, self_device_time_total=device_us, device_type="DeviceType.CUDA")

    # aten::mm launched 3 ms of sm90_gemm; a raw spin kernel of 2.8 ms came from no op; the
    # runtime's launch call is not an op
    averages = [
        cpu("aten::mm", 3000.0),
        kernel("sm90_gemm", 3000.0),
        kernel("spin_kernel", 2800.0),
        cpu("cudaLaunchKernel", 2800.0),
    ]
    rows = top_ops(averages, on_device=True)
    assert [r.name for r in rows] == ["aten::mm", OUTSIDE_OPS] and rows[1].ms == pytest.approx(2.8)
    quiet = replace_ops(anatomy(), (OpTime("aten::mm", 12, 4.0),))
    slow = replace_ops(anatomy(backward=12.8), (OpTime("aten::mm", 12, 4.0), OpTime(OUTSIDE_OPS, 1, 2.8)))
    text = explain([quiet], [slow], step_change_ms=2.8)
    assert text is not None and f"top op: {OUTSIDE_OPS} +2.80 ms/step (new in the top ops)" in text


def replace_ops(a: Anatomy, ops: tuple[OpTime, ...]) -> Anatomy:
    import dataclasses

    return dataclasses.replace(a, top_ops=ops, op_clock="device")


def test_no_anatomy_on_either_side_explains_nothing() -> None:
    assert explain([], [anatomy()]) is None and explain([anatomy()], []) is None
    assert explain([anatomy()], [anatomy()]) == "step anatomy: no category grew by more than 0.05 ms/step"


def test_round_trip_drops_nothing_and_reader_rejects_bad_fields() -> None:
    a = anatomy()
    assert Anatomy.from_dict(a.to_dict(), "x", "fix") == a
    assert "exposed communication 0.50 ms/step" in summary(a)
    bad = a.to_dict() | {"ms": {"warp drive": 1.0}}
    with pytest.raises(FileFormatError, match="unknown category 'warp drive'"):
        Anatomy.from_dict(bad, "baseline x", "re-record")
    with pytest.raises(FileFormatError, match="is nan, outside"):
        Anatomy.from_dict(a.to_dict() | {"ms": {"forward": math.nan}}, "baseline x", "re-record")


def test_a_trace_that_cannot_be_written_costs_the_trace_not_the_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch

    from scaleguard.ranks.profiling import PhasedStep, measure

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # the trace's directory is a file: mkdir fails
    phased = PhasedStep(
        step=lambda: torch.ones(64, 64) @ torch.ones(64, 64),
        phases=lambda grad_sync: {"data": 0.001, "forward": 0.002, "backward": 0.003, "optimizer": 0.001},
        can_skip_sync=False,
    )
    result = measure(phased, 2, [torch.profiler.ProfilerActivity.CPU], blocker / "trace.json")
    assert result.trace is None and result.ms["backward"] == pytest.approx(3.0)
    assert result.top_ops and result.op_clock == "cpu"


def test_the_story_says_how_much_the_phases_explain_and_names_only_a_material_op() -> None:
    # 2.7 ms slower step; backward +1.41, optimizer +0.53; the largest op moved 0.07 ms
    old = anatomy()
    new = Anatomy(
        ms={**old.ms, "backward": old.ms["backward"] + 1.41, "optimizer": old.ms["optimizer"] + 0.53},
        top_ops=(OpTime("aten::mm", 12, 4.07), OpTime("aten::addmm", 6, 2.0)),
        op_clock="cpu", steps=3, cost_s=0.4,
    )  # fmt: skip
    text = explain([old], [new], step_change_ms=2.7)
    assert text is not None and "backward +1.41" in text and "optimizer +0.53" in text
    assert "phases explain 1.9 of 2.7 ms" in text
    assert (
        "top op" not in text
        and "no single op stands out (largest: aten::mm +0.07 ms/step, 3% of the change)" in text
    )
    # an op that carries the change is named
    big = explain([anatomy()], [anatomy(backward=13.0, mm=7.0)], step_change_ms=3.2)
    assert (
        big is not None and "phases explain 3.0 of 3.2 ms" in big and "top op: aten::mm +3.00 ms/step" in big
    )


def cuda_anatomy(busy: float, hook_host_ms: float, backward: float, conv_ms: float = 9.0) -> Anatomy:
    import dataclasses

    hook = "autograd::engine::evaluate_function: BackwardHookFunctionBackward"
    return dataclasses.replace(
        anatomy(backward=backward),
        top_ops=(OpTime("aten::convolution_backward", 53, conv_ms), OpTime("aten::mm", 12, 4.0)),
        op_clock="device",
        device_busy_ms=busy,
        host_ops=(OpTime(hook, 1, hook_host_ms), OpTime("aten::convolution_backward", 53, 3.0)),
    )


def test_a_host_side_change_is_said_to_be_on_the_host_and_names_the_host_op() -> None:
    # a launch-bound step grew 15.8 ms; the kernels' busy time did not move; a backward hook
    # holds 12 ms more host time
    text = explain([cuda_anatomy(20.0, 0.02, 25.0)], [cuda_anatomy(20.1, 12.02, 37.0)], step_change_ms=15.8)
    assert text is not None and "GPU busy 20.0 -> 20.1 ms/step (the rest of the change is on the host" in text
    assert "top host op: autograd::engine::evaluate_function: BackwardHookFunctionBackward +12.00" in text
    assert "top op:" not in text


def test_a_device_side_change_keeps_the_device_op_and_says_nothing_of_the_host() -> None:
    text = explain(
        [cuda_anatomy(20.0, 0.02, 25.0)], [cuda_anatomy(22.8, 0.02, 27.8, conv_ms=11.8)], step_change_ms=2.8
    )
    assert text is not None and "GPU busy 20.0 -> 22.8 ms/step" in text and "host" not in text
    assert "top op: aten::convolution_backward +2.80 ms/step" in text


def test_the_cuda_fields_round_trip_and_an_older_record_without_them_still_reads() -> None:
    a = cuda_anatomy(20.0, 0.5, 25.0)
    assert Anatomy.from_dict(a.to_dict(), "x", "fix") == a
    older = {k: v for k, v in a.to_dict().items() if k not in ("device_busy_ms", "host_ops")}
    read = Anatomy.from_dict(older, "x", "fix")
    assert read.device_busy_ms is None and read.host_ops == ()
    # an older side says nothing of the GPU's busy time: the story keeps the device ops
    text = explain([read], [cuda_anatomy(20.1, 12.0, 37.0)], step_change_ms=12.0)
    assert text is not None and "GPU busy" not in text


def test_device_side_annotations_are_not_counted_as_kernels() -> None:
    from types import SimpleNamespace as Event

    from scaleguard.ranks.profiling import device_busy_ms, top_ops

    averages = [
        Event(key="aten::mm", count=1, self_device_time_total=3000.0, device_type="DeviceType.CPU"),
        Event(key="sm90_gemm", count=1, self_device_time_total=3000.0, device_type="DeviceType.CUDA"),
        # DDP's forward on the GPU timeline: spans the gemm, is no kernel of its own
        Event(
            key="DistributedDataParallel.forward",
            count=1,
            self_device_time_total=2900.0,
            device_type="DeviceType.CUDA",
            is_user_annotation=True,
        ),
    ]
    assert device_busy_ms(averages) == pytest.approx(3.0)
    # DataParallel: one process, two GPUs each busy 3 ms: the busiest device's 3 ms, not 6
    two = [Event(key="k", count=1, self_device_time_total=3000.0, device_type="DeviceType.CUDA", device_index=i)
           for i in (0, 1)]  # fmt: skip
    assert device_busy_ms(two) == pytest.approx(3.0)
    assert [r.name for r in top_ops(averages, on_device=True)] == ["aten::mm"]  # no "outside" row


def test_device_time_is_read_by_its_current_name_and_the_deprecated_one_never_touched() -> None:
    """torch >= 2.4 warns (FutureWarning) on every read of ``self_cuda_time_total``: reading it
    as a fallback default, evaluated every time, put one warning per op in every CUDA run's log."""
    import warnings

    from scaleguard.ranks.profiling import device_busy_ms, top_ops

    class Event:
        def __init__(self, key: str, us: float, device_type: str) -> None:
            self.key, self.count, self.self_device_time_total, self.device_type = key, 1, us, device_type

        @property
        def self_cuda_time_total(self) -> float:
            warnings.warn("`self_cuda_time_total` is deprecated", FutureWarning, stacklevel=2)
            return self.self_device_time_total

    averages = [Event("aten::mm", 3000.0, "DeviceType.CPU"), Event("sm90_gemm", 3000.0, "DeviceType.CUDA")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert device_busy_ms(averages) == pytest.approx(3.0)
        assert [(o.name, o.ms) for o in top_ops(averages, on_device=True)] == [("aten::mm", 3.0)]


def test_an_older_cuda_record_loses_its_outside_row_which_counted_annotations() -> None:
    from scaleguard.evidence.anatomy import OUTSIDE_OPS

    a = replace_ops(anatomy(), (OpTime(OUTSIDE_OPS, 1, 24.8), OpTime("aten::mm", 12, 24.3)))
    older = {k: v for k, v in a.to_dict().items() if k not in ("device_busy_ms", "host_ops")}
    assert [o.name for o in Anatomy.from_dict(older, "x", "fix").top_ops] == ["aten::mm"]


def test_an_op_that_only_moved_into_a_cut_table_is_not_new() -> None:
    import dataclasses

    # the baseline's table was cut at 8 rows (last 1.8 ms); tonight aten::sum (1.9 ms) made it in
    rows = (*(OpTime(f"aten::op{i}", 1, 10.0 - i) for i in range(7)), OpTime("aten::cat", 1, 1.8))
    old = dataclasses.replace(anatomy(), top_ops=rows)
    new = dataclasses.replace(anatomy(backward=12.0), top_ops=(*rows[:7], OpTime("aten::sum", 1, 1.9)))
    text = explain([old], [new], step_change_ms=2.0)
    assert text is not None and "no single op stands out" in text and "+1.90" not in text
    # in a table that was not cut (fewer than 8 rows) a missing op took nothing: it is new
    short = dataclasses.replace(anatomy(), top_ops=rows[:3])
    text = explain(
        [short],
        [dataclasses.replace(new, top_ops=(*rows[:3], OpTime("aten::sum", 1, 1.9)))],
        step_change_ms=2.0,
    )
    assert text is not None and "top op: aten::sum +1.90 ms/step (new in the top ops)" in text


def test_a_hostile_busy_time_is_refused_by_the_reader() -> None:
    a = cuda_anatomy(20.0, 0.5, 25.0).to_dict()
    for bad in (math.nan, 1e300, -1.0, "fast"):
        with pytest.raises(FileFormatError, match="device_busy_ms"):
            Anatomy.from_dict(a | {"device_busy_ms": bad}, "baseline x", "re-record")
    with pytest.raises(FileFormatError, match="host_ops"):
        Anatomy.from_dict(a | {"host_ops": "many"}, "baseline x", "re-record")
