"""Past one machine: the session's runs as steps of one Slurm allocation.

How a case becomes a job: the session asks Slurm once for an allocation of the most nodes any
case needs (``salloc --no-shell``: no batch script, the nodes held until we release them), then
every run of every case is one job step on it, ``srun --jobid J --nodes n --ntasks ws``, one
task per rank (one per GPU), each task mapping Slurm's ``SLURM_PROCID``/``SLURM_LOCALID`` to
torch's ``RANK``/``LOCAL_RANK`` in ``torchrun_entry`` and meeting the others at the first node
of the step (env:// rendezvous). Rank 0 writes the run's record into the run's directory under
the shared results directory; the session reads it through the one validating reader and judges
it as it judges a local run: repeats, confirm runs, the ws1 reference, baselines, history.

Why one allocation and steps, not a job per run: every run of the session (ws1 and ws16, A and
B of ``scaleguard ab``) lands on the same nodes, so speedup and the paired A/B compare like with
like; the queue is waited on once; a step's failure is srun's exit status and its stderr, read
at once, not a poll. Why plain ``salloc``/``srun`` rather than submitit: submitit hands results
back as pickles in the shared folder (a file there would run code in the session that reads
it), its executor has no queue reason for a job that never starts, and its job-per-call model
is the one rejected above. The price: a session killed with SIGKILL leaves its allocation until
the allocation's time limit (``--perf-slurm-time``); every other exit releases it.

Faults are said, never waited out: an allocation still pending after
``--perf-slurm-pending-timeout`` is cancelled with Slurm's reason; a step that fails, passes its
time limit, loses a node or is preempted fails its case with the step id, its state and the
first failing rank's error; Ctrl-C cancels the step and the allocation.
"""

from __future__ import annotations

import os
import random
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scaleguard.case import CaseSpec
from scaleguard.evidence.document import inert
from scaleguard.evidence.records import (
    FileFormatError,
    RankFailure,
    atomic_write_json,
    read_document,
)
from scaleguard.evidence.runs import RunRecord
from scaleguard.ranks.protocol import CaseFailedError, Interpreter

COMMANDS = ("salloc", "srun", "scancel", "squeue", "scontrol")
POLL_S = 1.0
RELEASE_DEADLINE_S = 60.0  # scancel, then squeue must stop listing the allocation
STEP_GRACE_S = 30.0  # past the case's own deadline, srun is interrupted (its ranks killed)
OUTPUT_TAIL = 40  # lines of srun's output kept for a failure's story
# srun's log is read from both ends only: NCCL's INFO lines of 16 ranks run to megabytes, and a
# rank may print anything. Its start holds NCCL's transport, its end how the step ended
LOG_HEAD_BYTES = LOG_TAIL_BYTES = 256 * 2**10


class SlurmError(RuntimeError):
    """A fault of the scheduler or of a job step, said in one sentence with the job's id."""


class PendingTooLong(SlurmError):
    """The allocation did not start within the deadline; it was cancelled."""


class NotStarted(CaseFailedError):
    """The session's allocation never started (or Slurm refused it): the case did not run.
    ``skip``: the user asked for such cases to be skipped rather than failed."""

    def __init__(self, case_id: str, rank: int | None, reason: str, skip: bool = False) -> None:
        super().__init__(case_id, rank, reason)
        self.skip = skip


@dataclass(frozen=True)
class SlurmOptions:
    """What ``--perf-slurm-*`` asked for (``config.PerfConfig`` reads and checks them)."""

    nodes: tuple[int, ...] = (1, 2)  # node counts the cases span (ws = nodes x ranks per node)
    ranks_per_node: int = 1  # GPUs per node on CUDA; processes per node on CPU
    partition: str | None = None
    account: str | None = None
    time_min: int = 120  # the allocation's time limit, minutes
    extra_args: tuple[str, ...] = ()  # more salloc arguments (--constraint, --qos, --gres ...)
    shared_dir: Path | None = None  # on a file system every node sees; default <rootdir>/.scaleguard/slurm
    pending_timeout_s: float = 600.0
    skip_pending: bool = False  # a session whose allocation never starts skips instead of failing

    def to_dict(self) -> dict[str, Any]:
        return {  # plain values: a baseline's hardware record holds no lists
            "nodes": ",".join(map(str, self.nodes)),
            "ranks_per_node": self.ranks_per_node,
            "partition": self.partition,
            "account": self.account,
        }


def missing_commands() -> list[str]:
    import shutil

    return [c for c in COMMANDS if shutil.which(c) is None]


def _run(cmd: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """A Slurm client command with a deadline; its failure is a ``SlurmError`` with its words."""
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(cmd)}` did not answer within {timeout_s:.0f} s") from None
    except OSError as exc:
        raise SlurmError(f"`{cmd[0]}` cannot run ({exc}); is Slurm's client installed here?") from None
    return done


def _show(kind: str, name: str) -> dict[str, str]:
    """``scontrol show KIND NAME -o`` as a dict (empty when Slurm no longer knows it)."""
    done = _run(["scontrol", "show", kind, name, "-o"])
    if done.returncode != 0:
        return {}
    fields: dict[str, str] = {}
    for token in done.stdout.split():
        key, sep, value = token.partition("=")
        if sep:
            fields.setdefault(key, value)
    return fields


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for salloc and srun without the SLURM_* of a job this session may run in
    (an sbatch wrapper): srun reads SLURM_NTASKS, SLURM_CPUS_PER_TASK ... as if they were its
    own flags. SLURM_CONF (which cluster) stays."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def hostnames(nodelist: str) -> list[str]:
    done = _run(["scontrol", "show", "hostnames", nodelist])
    return done.stdout.split() if done.returncode == 0 else [nodelist]


def queue_state(job_id: str) -> tuple[str, str] | None:
    """(state, reason) of a job while squeue lists it; None once it is gone."""
    done = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"])
    line = done.stdout.strip().splitlines()
    if done.returncode != 0 or not line:
        return None
    state, _, reason = line[0].partition("|")
    return state, reason


_JOB_ID = re.compile(r"job allocation (\d+)")
# srun's and slurmstepd's words for why a step ended
_STEP_STATES = (
    ("DUE TO TIME LIMIT", "TIMEOUT"),
    ("DUE TO NODE FAILURE", "NODE_FAIL"),
    ("DUE TO PREEMPTION", "PREEMPTED"),
    ("Exceeded job memory limit", "OUT_OF_MEMORY"),
    ("oom-kill", "OUT_OF_MEMORY"),
    # a task that died took the step down with it (--kill-on-bad-exit): FAILED, as sacct says
    ("Exited with exit code", "FAILED"),
    (": Killed", "FAILED"),
    ("CANCELLED", "CANCELLED"),
)


def step_state(output: str, returncode: int) -> str:
    """The step's end as Slurm names it (sacct's states), from srun's own output."""
    if returncode == 0:
        return "COMPLETED"
    if "has expired" in output or "Invalid job id" in output or "Job has been cancelled" in output:
        return "ALLOCATION_ENDED"
    for words, state in _STEP_STATES:
        if words in output:
            return state
    return "FAILED"


_TASK = re.compile(r"srun: error: (\S+): tasks? ([\d,-]+): (.+)")


def first_task_error(output: str) -> str | None:
    """srun's first word on a task that ended badly: "task 1 on n2: Killed"."""
    for line in output.splitlines():
        match = _TASK.search(line)
        if match and "Terminated" not in match.group(3):  # peers srun itself ended
            return f"task {match.group(2)} on {match.group(1)}: {match.group(3).strip()}"
    return None


def nccl_transport(output: str) -> str | None:
    """NCCL's inter-node transport, from its INIT/NET log lines (``NCCL INFO NET/IB``,
    ``NET/Socket``), when NCCL_DEBUG=INFO showed them; None when unknown."""
    match = re.search(r"NCCL INFO (?:NET/|Using network )(\w+)", output)
    return match.group(1) if match else None


class Allocation:
    """One allocation held for a session: acquired with a deadline, released on every exit."""

    def __init__(self, options: SlurmOptions, nodes: int, name: str, say: Callable[[str], None]) -> None:
        self.options = options
        self.nodes = nodes
        self.name = name
        self.say = say
        self.job_id: str | None = None
        self.nodelist: tuple[str, ...] = ()
        self.head_addr = ""
        self._steps = 0

    # -- holding the nodes ---------------------------------------------------------------------

    def salloc_command(self) -> list[str]:
        opts = self.options
        cmd = [
            "salloc",
            "--no-shell",
            f"--nodes={self.nodes}",
            f"--ntasks-per-node={opts.ranks_per_node}",
            f"--job-name={self.name}",
            f"--time={opts.time_min}",
        ]
        if opts.partition:
            cmd.append(f"--partition={opts.partition}")
        if opts.account:
            cmd.append(f"--account={opts.account}")
        return cmd + list(opts.extra_args)

    def acquire(self) -> None:
        """Ask for the nodes and wait, at most the pending deadline, until they are granted.

        Raises:
            PendingTooLong: still pending at the deadline (cancelled, with Slurm's reason).
            SlurmError: salloc refused the request (a partition or account that does not exist).
        """
        cmd = self.salloc_command()
        deadline = time.monotonic() + self.options.pending_timeout_s
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env=clean_env(os.environ),
        )  # fmt: skip
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            os.set_blocking(proc.stdout.fileno(), False)
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            reason = ""
            buffer = ""
            while True:
                for _ in sel.select(timeout=POLL_S):
                    chunk = proc.stdout.read() or ""
                    buffer += chunk
                    *done, buffer = buffer.split("\n")
                    lines += done
                    for line in done:
                        match = _JOB_ID.search(line)
                        if match and self.job_id is None:
                            self.job_id = match.group(1)
                if any("Granted job allocation" in line for line in lines):
                    break
                if proc.poll() is not None and not any("Granted" in line for line in lines):
                    rest = proc.stdout.read() or ""
                    lines += (buffer + rest).splitlines()
                    if any("Granted job allocation" in line for line in lines):
                        break
                    said = inert(" | ".join(line.strip() for line in lines if line.strip())[-600:])
                    raise SlurmError(f"`{shlex.join(cmd)}` failed (exit {proc.returncode}): {said}")
                if self.job_id is not None:
                    state = queue_state(self.job_id)
                    if state is not None:
                        reason = inert(state[1][:200])
                if time.monotonic() > deadline:
                    waited = self.options.pending_timeout_s
                    job = self.job_id or "(no id yet)"
                    self.release()
                    raise PendingTooLong(
                        f"Slurm allocation {job} ({self.nodes} node(s), partition "
                        f"{self.options.partition or 'default'}) still pending after {waited:.0f} s "
                        f"(reason: {reason or 'unknown'}); cancelled"
                    )
        except BaseException:
            # Ctrl-C or the pending deadline: salloc revokes a pending request on SIGINT
            if proc.poll() is None:
                _kill_group(proc)
            self.release()
            raise
        # granted: salloc --no-shell exits by itself now; a signal would revoke the allocation
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        assert self.job_id is not None
        info = _show("job", self.job_id)
        self.nodelist = tuple(hostnames(info.get("NodeList", "")))
        head = _show("node", self.nodelist[0]) if self.nodelist else {}
        self.head_addr = head.get("NodeAddr") or (self.nodelist[0] if self.nodelist else "")
        self.say(
            f"Slurm allocation {self.job_id}: {len(self.nodelist)} node(s) {','.join(self.nodelist)}, "
            f"{self.options.ranks_per_node} rank(s) per node"
        )

    def release(self) -> None:
        """Cancel the allocation (and any step on it) and wait until squeue no longer lists it."""
        if self.job_id is None:
            return
        job, self.job_id = self.job_id, None
        _run(["scancel", job])
        deadline = time.monotonic() + RELEASE_DEADLINE_S
        while time.monotonic() < deadline:
            state = queue_state(job)
            if state is None or state[0] in ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT"):
                return
            time.sleep(0.2)
        self.say(f"Slurm allocation {job} still listed {RELEASE_DEADLINE_S:.0f} s after scancel")

    # -- one run ---------------------------------------------------------------------------------

    def step(
        self,
        argv: Sequence[str],
        nodes: int,
        ntasks: int,
        env: Mapping[str, str],
        timeout_s: float,
        log: Path,
    ) -> StepOutcome:
        """Run ``argv`` as one job step of ``ntasks`` tasks over ``nodes`` nodes, with a
        deadline; Ctrl-C (or any exception) interrupts srun, which cancels the step."""
        if self.job_id is None:
            raise SlurmError("the session's Slurm allocation is gone (released, or it ended)")
        self._steps += 1
        per_node = -(-ntasks // nodes)
        # the step's time limit: Slurm ends it even if this session dies
        # (a minute more than ours, rounded up: Slurm checks limits about once a minute)
        limit_min = max(1, int(-(-(timeout_s + STEP_GRACE_S) // 60))) + 1
        cmd = [
            "srun",
            f"--jobid={self.job_id}",
            f"--nodes={nodes}",
            f"--ntasks={ntasks}",
            f"--ntasks-per-node={per_node}",
            # the first n nodes of the allocation, in order: rank 0 (and the rendezvous) lands on
            # the first, and every run of an n-node case uses the same nodes
            f"--nodelist={','.join(self.nodelist[:nodes])}",
            "--kill-on-bad-exit=1",
            f"--time={limit_min}",
            f"--job-name={self.name}",
            "--quit-on-interrupt",
            *argv,
        ]
        started = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=clean_env(env), start_new_session=True
            )
            try:
                returncode = proc.wait(timeout=timeout_s + STEP_GRACE_S)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                returncode, timed_out = proc.returncode if proc.returncode is not None else -9, True
            except BaseException:
                _kill_group(proc)
                raise
        output = read_log(log)
        state = "TIMEOUT" if timed_out else step_state(output, returncode)
        step_id = _step_id(output) or f"{self.job_id} (step {self._steps})"
        return StepOutcome(step_id, returncode, state, time.monotonic() - started, output, timed_out)


@dataclass(frozen=True)
class StepOutcome:
    step_id: str  # "J.S"
    returncode: int
    state: str  # COMPLETED, FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY, CANCELLED
    wall_s: float
    output: str
    timed_out: bool  # our deadline, not Slurm's

    def tail(self) -> str:
        """srun's last lines, each made inert for the terminal (ranks may print anything)."""
        lines = [line for line in self.output.splitlines() if line.strip()]
        return "\n".join(inert(line[:500]) for line in lines[-OUTPUT_TAIL:])


def read_log(log: Path) -> str:
    """The first and last 256 KiB of srun's log (all of it when smaller)."""
    with log.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(0)
        if size <= LOG_HEAD_BYTES + LOG_TAIL_BYTES:
            data = fh.read()
        else:
            head = fh.read(LOG_HEAD_BYTES)
            fh.seek(size - LOG_TAIL_BYTES)
            skipped = size - LOG_HEAD_BYTES - LOG_TAIL_BYTES
            data = head + f"\n[... {skipped} bytes of srun's log not read ...]\n".encode() + fh.read()
    return data.decode("utf-8", errors="replace")


_STEP_ID = re.compile(r"StepId=(\d+\.\d+)|STEP (\d+\.\d+)")


def _step_id(output: str) -> str | None:
    match = _STEP_ID.search(output)
    return (match.group(1) or match.group(2)) if match else None


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """srun cancels its step on SIGINT (twice within a second) and is killed past a grace."""
    for sig, wait_s in ((signal.SIGINT, 0.3), (signal.SIGINT, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


class SlurmRunner:
    """The session's run function on a cluster: ``(spec, run_dir, timeout_s) -> RunRecord``,
    raising ``protocol.CaseFailedError`` for a run that did not finish on every rank."""

    def __init__(self, allocation: Allocation, python: str = sys.executable) -> None:
        self.allocation = allocation
        self.python = python
        self.skip_pending = allocation.options.skip_pending
        self.not_started: str | None = None

    def __call__(
        self, spec: CaseSpec, run_dir: Path, timeout_s: float, interpreter: Interpreter | None = None
    ) -> RunRecord:
        """One run as one job step; ``interpreter``: side A or B of ``scaleguard ab`` (same nodes)."""
        alloc = self.allocation
        if self.not_started is not None:  # the queue never gave us the nodes: said once, per case
            raise NotStarted(spec.case_id, None, self.not_started, skip=self.skip_pending)
        if alloc.job_id is None:
            try:
                alloc.acquire()
            except SlurmError as exc:
                self.not_started = str(exc)
                raise NotStarted(spec.case_id, None, str(exc), skip=self.skip_pending) from None
        run_dir.mkdir(parents=True, exist_ok=True)
        spec_path = run_dir / "case.json"
        atomic_write_json(spec_path, spec.to_dict())
        nodes = spec.settings.nodes
        env = {**os.environ, **dict(interpreter.env if interpreter else ())}
        python = interpreter.python if interpreter else self.python
        env.update(
            MASTER_ADDR=alloc.head_addr if nodes > 1 else "127.0.0.1",
            MASTER_PORT=str(random.randint(20000, 59999)),
            SCALEGUARD_RUN_ID=f"slurm-{alloc.job_id}-{run_dir.name}",
        )
        if spec.device == "cuda" and "NCCL_DEBUG" not in env:
            # the transport NCCL picked between nodes (IB, Socket) goes into the run's record
            env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET")
        argv = [python, "-m", "scaleguard.schedule.torchrun_entry", "--spec", str(spec_path),
                "--out", str(run_dir)]  # fmt: skip
        try:
            outcome = alloc.step(argv, nodes, spec.nprocs, env, timeout_s, run_dir / "srun.log")
        except SlurmError as exc:
            raise CaseFailedError(spec.case_id, None, str(exc)) from None
        if outcome.returncode != 0 or outcome.state != "COMPLETED":
            raise self._failure(spec, run_dir, outcome, timeout_s)
        from scaleguard.schedule.torchrun_entry import read_finished_record, record_path

        try:
            _, result = read_finished_record(record_path(run_dir, spec.case_id))
        except FileFormatError as exc:
            raise CaseFailedError(
                spec.case_id, None, f"Slurm step {outcome.step_id} completed but left no usable record: {exc}"
            ) from None
        facts = {
            "job": outcome.step_id,
            "nodes": list(alloc.nodelist[:nodes]),
            "ranks_per_node": -(-spec.nprocs // nodes),
            "partition": alloc.options.partition,
            "nccl_net": nccl_transport(outcome.output),
        }
        measured = sum(result.step_s)
        return replace(
            result,
            wall_s=outcome.wall_s,
            # where the step's wall time went, as far as the parent sees it from the login node
            phases_s={
                "measured steps": measured,
                "srun start, setup, warmup, anatomy, record": max(0.0, outcome.wall_s - measured),
            },
            host={**result.host, "slurm": facts},
        )

    def _failure(self, spec: CaseSpec, run_dir: Path, outcome: StepOutcome, timeout_s: float) -> Exception:
        failure = first_failure(run_dir / f"{spec.case_id}.ranks", spec.nprocs)
        if outcome.state == "ALLOCATION_ENDED":
            why = (
                f"could not start: the session's allocation ended (its time limit, --perf-slurm-time "
                f"{self.allocation.options.time_min} min, or cancelled from outside)"
            )
        elif outcome.timed_out:
            why = f"past its deadline of {timeout_s + STEP_GRACE_S:.0f} s; srun interrupted, step cancelled"
        else:
            why = f"ended {outcome.state} (srun exit {outcome.returncode})"
        task = first_task_error(outcome.output)
        # Slurm's task number is the rank: a task killed outright names the rank that died
        task_rank = re.match(r"task (\d+)", task) if task else None
        rank = int(task_rank.group(1)) if task_rank else (failure.rank if failure else None)
        parts = [f"srun: {inert(task)}"] if task else []
        if failure:
            said = f"{failure.exc_type}: {failure.message}"
            parts.append(f"rank {failure.rank} in {inert(failure.phase)}: {inert(said[:2000])}")
        elif not task:
            parts.append("no rank wrote an error (killed, or lost with its node)")
        said = "; " + "; ".join(parts)
        return CaseFailedError(
            spec.case_id,
            rank,
            f"Slurm step {outcome.step_id} on {','.join(self.allocation.nodelist[: spec.settings.nodes])} "
            f"{why}{said}",
            outcome.tail(),
        )


def first_failure(ranks_dir: Path, nprocs: int) -> RankFailure | None:
    """The earliest error any rank wrote (the root cause; its peers' errors follow from it)."""
    found: list[RankFailure] = []
    for rank in range(nprocs):
        path = ranks_dir / f"rank{rank}.error.json"
        if not path.is_file():
            continue
        try:
            found.append(
                RankFailure.from_dict(read_document(path, "rank error", "a scaleguard bug"), str(path))
            )
        except FileFormatError:
            continue
    return min(found, key=lambda f: f.unix_time) if found else None


# -- planning on a cluster -----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFacts:
    """What ``sinfo`` says of the partition's nodes (the login node's own hardware is not theirs)."""

    cpus: int  # per node, the smallest of the partition
    gpu_type: str | None  # the GRES type ("h100" of "gpu:h100:8"), None without GPUs
    nodes_up: int


def node_facts(options: SlurmOptions) -> NodeFacts:
    cmd = ["sinfo", "-h", "-N", "-o", "%c|%G|%N|%t"]
    if options.partition:
        cmd += ["-p", options.partition]
    done = _run(cmd)
    rows = [line.split("|") for line in done.stdout.splitlines() if line.count("|") == 3]
    if done.returncode != 0 or not rows:
        where = f"partition {options.partition}" if options.partition else "the default partition"
        said = (done.stderr or done.stdout).strip()[:300]
        raise SlurmError(f"sinfo lists no node in {where}{': ' + said if said else ''}")
    cpus = min(int(r[0]) for r in rows if r[0].isdigit()) if any(r[0].isdigit() for r in rows) else 1
    gpu = None
    for row in rows:
        match = re.match(r"gpu:([A-Za-z0-9_.-]+):\d+", row[1])
        if match:
            gpu = match.group(1)
    up = len({r[2] for r in rows if not r[3].startswith(("down", "drain", "fail"))})
    return NodeFacts(cpus, gpu, up)


def plan_on_cluster(matrix: Any, options: SlurmOptions, facts: NodeFacts) -> list[Any]:
    """The matrix for ``nodes x ranks per node``: world sizes 1 and ``rpn x n`` for each node
    count, each case marked with the nodes it spans; what cannot run there says why."""
    from scaleguard.machine.env import GpuInventory
    from scaleguard.schedule.matrix import PlannedCase, plan

    rpn, max_nodes = options.ranks_per_node, max(options.nodes)
    device = matrix.device if matrix.device != "auto" else ("cuda" if facts.gpu_type else "cpu")
    world_sizes = matrix.world_sizes or tuple(sorted({1, *(rpn * n for n in options.nodes)}))
    threads = matrix.threads_per_rank or max(1, facts.cpus // rpn)
    gpus = (
        GpuInventory(rpn * max_nodes, (facts.gpu_type or "gpu",) * (rpn * max_nodes))
        if device == "cuda"
        else (GpuInventory(0, ()))
    )
    planned = plan(
        replace(matrix, device=device, world_sizes=world_sizes, threads_per_rank=threads),
        gpus,
        facts.cpus * max_nodes,
    )
    out = []
    for case in planned:
        spec = case.spec
        nodes = -(-spec.nprocs // rpn)
        reason = case.skip_reason
        if reason is None and spec.mode == "dp" and spec.world_size > rpn:
            reason = f"DataParallel is one process: at most the {rpn} GPUs of one node"
        elif reason is None and nodes > max_nodes:
            reason = f"needs {nodes} nodes of {rpn} ranks; --perf-slurm-nodes allows {max_nodes}"
        elif reason is None and spec.nprocs % nodes:
            reason = f"{spec.nprocs} ranks do not split evenly over {nodes} nodes"
        elif reason is None and spec.device == "cpu" and -(-spec.nprocs // nodes) * threads > facts.cpus:
            reason = f"{rpn} ranks x {threads} threads exceed a node's {facts.cpus} CPUs"
        elif reason is None and nodes > facts.nodes_up:
            reason = f"needs {nodes} nodes; the partition has {facts.nodes_up} up"
        out.append(PlannedCase(replace(spec, settings=replace(spec.settings, nodes=nodes)), reason))
    return out


def cluster_hardware_key(
    device: str, facts: NodeFacts, options: SlurmOptions, cpu_model: str, threads: int
) -> str:
    """``slurm-<the per-node key>-<ranks per node>pn``: a cluster's baseline is never a single
    machine's, and the node count is in each case's configuration (``nodes``)."""
    from scaleguard.evidence.baseline import hardware_key

    rpn = options.ranks_per_node
    return f"slurm-{hardware_key(device, facts.gpu_type, rpn, cpu_model, threads)}-{rpn}pn"
