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
from scaleguard.evidence.files import FileFormatError, atomic_write_json, inert, read_document
from scaleguard.evidence.records import RankFailure
from scaleguard.evidence.runs import RunRecord
from scaleguard.machine import processes
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
    extra_args: tuple[str, ...] = ()  # more salloc arguments (--constraint, --qos ...)
    shared_dir: Path | None = None  # on a file system every node sees; default <rootdir>/.scaleguard/slurm
    pending_timeout_s: float = 600.0
    skip_pending: bool = False  # a session whose allocation never starts skips instead of failing
    gpus_per_node: int | None = None  # None: the ranks per node on cuda, none on cpu
    gpu_type: str | None = None  # the GRES type asked for ("h100" of h100:8), None: any
    gpu_bind: str = "node"  # node: every rank sees the node's GPUs; task: one GPU per rank
    cpus_per_task: int | None = None  # None: a node's CPUs / ranks per node
    mem: str = "0"  # per node, as Slurm writes sizes; 0: all of it
    exclusive: bool = True
    srun_args: tuple[str, ...] = ()  # more srun arguments for every step (containers, --mpi ...)
    python: str | None = None  # the interpreter inside the step; None: the session's own
    export: tuple[tuple[str, str], ...] = ()  # environment for every step's ranks
    iface: str | None = None  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
    retries: int = 1  # new allocations after a lost one

    def to_dict(self) -> dict[str, Any]:
        return {  # plain values: a baseline's hardware record holds no lists
            "nodes": ",".join(map(str, self.nodes)),
            "ranks_per_node": self.ranks_per_node,
            "partition": self.partition,
            "account": self.account,
        }

    def resources(self, device: str, facts: NodeFacts) -> Resources:
        """What each node and each rank is given, with the defaults decided for this device."""
        rpn = self.ranks_per_node
        gpus = self.gpus_per_node if self.gpus_per_node is not None else (rpn if device == "cuda" else 0)
        return Resources(
            ranks_per_node=rpn,
            gpus_per_node=gpus,
            gpu_type=self.gpu_type,
            gpu_bind=self.gpu_bind if gpus else "none",
            cpus_per_task=self.cpus_per_task or max(1, facts.cpus // rpn),
            mem=self.mem,
            exclusive=self.exclusive,
        )


@dataclass(frozen=True)
class Resources:
    """What the allocation and every step ask Slurm for, per node and per task."""

    ranks_per_node: int
    gpus_per_node: int
    gpu_type: str | None
    gpu_bind: str  # node, task, or none (no GPUs asked for)
    cpus_per_task: int
    mem: str
    exclusive: bool

    def _gpus(self, count: int) -> str:
        return f"{self.gpu_type}:{count}" if self.gpu_type else str(count)

    def salloc_args(self) -> list[str]:
        args = [f"--ntasks-per-node={self.ranks_per_node}", f"--cpus-per-task={self.cpus_per_task}",
                f"--mem={self.mem}"]  # fmt: skip
        if self.gpus_per_node:
            args.append(f"--gpus-per-node={self._gpus(self.gpus_per_node)}")
        if self.exclusive:
            args.append("--exclusive")
        return args

    def step_args(self, whole_node: bool = False) -> list[str]:
        """A run's step: each task its CPUs; the GPUs per node (each rank takes cuda:LOCAL_RANK)
        or one per task (each rank sees one device and takes cuda:0). ``whole_node``: one task
        per node given all of it (the pre-flight)."""
        cpus = self.cpus_per_task * (self.ranks_per_node if whole_node else 1)
        args = [f"--cpus-per-task={cpus}", f"--mem={self.mem}"]
        if self.gpu_bind == "task" and not whole_node:
            args.append(f"--gpus-per-task={self._gpus(1)}")
        elif self.gpus_per_node:
            # all of the node's: a DataParallel rank drives them all, and the node is ours
            args.append(f"--gpus-per-node={self._gpus(self.gpus_per_node)}")
        return args

    def tres(self) -> str:
        """The request in Slurm's TRES words, per node, for the record and the header."""
        gres = ""
        if self.gpus_per_node:
            gres = f",gres/gpu{':' + self.gpu_type if self.gpu_type else ''}={self.gpus_per_node}"
        return (
            f"cpu={self.cpus_per_task * self.ranks_per_node},mem={self.mem}{gres} per node; "
            f"{self.ranks_per_node} task(s) x {self.cpus_per_task} cpu"
            f"{', 1 gpu per task' if self.gpu_bind == 'task' else ''}"
            f"{', exclusive' if self.exclusive else ', shared'}"
        )


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


# torch's rendezvous variables a login shell may hold: a step's ranks take theirs from Slurm
TORCH_RANK_VARS = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"})


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for salloc and srun without the SLURM_* of a job this session may run in
    (an sbatch wrapper): srun reads SLURM_NTASKS, SLURM_CPUS_PER_TASK ... as if they were its
    own flags. SLURM_CONF (which cluster) stays. A stray RANK, WORLD_SIZE ... goes too."""
    return {
        k: v
        for k, v in env.items()
        if (not k.startswith("SLURM_") or k == "SLURM_CONF") and k not in TORCH_RANK_VARS
    }


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

    def __init__(
        self,
        options: SlurmOptions,
        nodes: int,
        name: str,
        say: Callable[[str], None],
        resources: Resources | None = None,
        exclude: tuple[str, ...] = (),
    ) -> None:
        self.options = options
        self.nodes = nodes
        self.name = name
        self.say = say
        self.resources = resources or options.resources("cpu", NodeFacts(1, None, nodes))
        self.exclude = exclude  # nodes a lost allocation left behind as failed
        self.job_id: str | None = None
        self.nodelist: tuple[str, ...] = ()
        self.addrs: dict[str, str] = {}  # node -> its NodeAddr
        self.head_addr = ""
        self.acquired_at = 0.0  # time.monotonic() when granted, for the node-minutes held
        self.held_s = 0.0  # node-seconds held before acquired_at (released, or given back)
        self._steps = 0
        self._no_shrink = False  # Slurm refused to give nodes back once: not asked again

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
            *self.resources.salloc_args()[1:],  # (--ntasks-per-node is above)
        ]
        if opts.partition:
            cmd.append(f"--partition={opts.partition}")
        if opts.account:
            cmd.append(f"--account={opts.account}")
        if self.exclude:
            cmd.append(f"--exclude={','.join(self.exclude)}")
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
        self.addrs = {node: _show("node", node).get("NodeAddr") or node for node in self.nodelist}
        self.head_addr = self.addrs[self.nodelist[0]] if self.nodelist else ""
        self.acquired_at = time.monotonic()
        self.say(
            f"Slurm allocation {self.job_id}: {len(self.nodelist)} node(s) {','.join(self.nodelist)}, "
            f"{self.resources.tres()}" + (f"; excluding {','.join(self.exclude)}" if self.exclude else "")
        )

    def shrink(self, nodes: int) -> None:
        """Give back every node past the first ``nodes`` (``scontrol update JobId NodeList``):
        the cases left need no more, and a held idle node is a node another team waits for.
        Slurm may refuse for a moment ("the DB index is being set"), or for good where no
        accounting runs: a refusal costs node-minutes, never the session."""
        if self.job_id is None or self._no_shrink or not 1 <= nodes < len(self.nodelist):
            return
        keep = self.nodelist[:nodes]
        deadline = time.monotonic() + SHRINK_DEADLINE_S
        said = ""
        now = self.nodelist
        while time.monotonic() < deadline:
            done = _run(["scontrol", "update", f"JobId={self.job_id}", f"NodeList={','.join(keep)}"])
            said = (done.stderr or done.stdout).strip()
            now = tuple(hostnames(_show("job", self.job_id).get("NodeList", ""))) or now
            if len(now) <= nodes:
                break
            time.sleep(1.0)
        if len(now) > nodes:
            self._no_shrink = True
            self.say(
                f"Slurm allocation {self.job_id}: could not give back {','.join(self.nodelist[nodes:])} "
                f"({inert(said[:200]) or 'no reason given'}); they stay held until the session ends"
            )
            return
        released = [n for n in self.nodelist if n not in now]
        clock = time.monotonic()
        self.held_s += (clock - self.acquired_at) * len(self.nodelist)
        self.acquired_at = clock
        self.nodelist, self.nodes = now, len(now)
        self.say(
            f"Slurm allocation {self.job_id}: gave back {','.join(released)} (the cases left need "
            f"{nodes} node(s))"
        )

    def alive(self) -> tuple[bool, str]:
        """Whether the allocation still runs, and Slurm's word on it (its state and reason)."""
        if self.job_id is None:
            return False, "released"
        info = _show("job", self.job_id)
        state = info.get("JobState", "")
        if not info:
            return False, "no longer known to Slurm"
        return state == "RUNNING", f"{state} ({info.get('Reason', 'None')})"

    def failed_nodes(self) -> tuple[str, ...]:
        """Nodes of this allocation that Slurm now calls down, drained or failing."""
        bad = []
        for node in self.nodelist:
            state = _show("node", node).get("State", "")
            if any(word in state for word in ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING")):
                bad.append(node)
        return tuple(bad)

    def release(self) -> None:
        """Cancel the allocation (and any step on it) and wait until squeue no longer lists it."""
        if self.job_id is None:
            return
        job, self.job_id = self.job_id, None
        self.held_s += (time.monotonic() - self.acquired_at) * len(self.nodelist)
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
        per_node: int | None = None,
        extra: Sequence[str] = (),
    ) -> StepOutcome:
        """Run ``argv`` as one job step of ``ntasks`` tasks over ``nodes`` nodes, with a
        deadline; Ctrl-C (or any exception) interrupts srun, which cancels the step."""
        if self.job_id is None:
            raise SlurmError("the session's Slurm allocation is gone (released, or it ended)")
        self._steps += 1
        per_node_given = per_node is not None
        per_node = per_node or -(-ntasks // nodes)
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
            *self.resources.step_args(whole_node=per_node_given),
            *self.options.srun_args,  # the site's launch: containers, --mpi, a reservation
            *extra,  # one side's own (paired A/B: its container), after the site's: it wins
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
    processes.stop_group(proc, ((signal.SIGINT, 0.3), (signal.SIGINT, 5.0)))


class InfrastructureError(CaseFailedError):
    """The cluster, not the case: the session's allocation was lost (preempted, a node failed,
    cancelled from outside) and no new one ran the case. Reported apart from REGRESSED and from
    a failed case, and the session exits ``EXIT_INFRASTRUCTURE`` when nothing worse happened."""

    infra = True


# sysexits' EX_TEMPFAIL, "try again later": a night the cluster lost, not one the product failed
EXIT_INFRASTRUCTURE = 75
# how a step can end when its allocation went away under it (``scontrol``'s JobState words too)
LOST = frozenset({"PREEMPTED", "NODE_FAIL", "ALLOCATION_ENDED", "CANCELLED", "BOOT_FAIL", "REVOKED"})
# the rendezvous port: below Linux's ephemeral range (32768-60999), so no outgoing connection
# of the node holds it by chance; a port taken anyway is retried once with another
PORTS = (20000, 32767)
PREFLIGHT_TIMEOUT_S = 180.0
SHRINK_DEADLINE_S = 10.0


class SlurmRunner:
    """The session's run function on a cluster: ``(spec, run_dir, timeout_s) -> RunRecord``,
    raising ``protocol.CaseFailedError`` for a run that did not finish on every rank, and
    ``InfrastructureError`` for one the cluster took away (after one new allocation)."""

    def __init__(
        self,
        allocation: Allocation,
        python: str | None = None,
        preflight_dir: Path | None = None,
        device: str = "cpu",
    ) -> None:
        self.allocation = allocation
        self.python = python or allocation.options.python or sys.executable
        self.skip_pending = allocation.options.skip_pending
        self.preflight_dir = preflight_dir  # None: no pre-flight (a session that asked for none)
        self.device = device
        self.not_started: str | None = None
        self.lost: str | None = None  # the allocation was lost and no new one could be had
        self.retries_left = allocation.options.retries
        self.preflight: Any = None  # preflight.Preflight of the current allocation
        self.released_held_s = 0.0  # node-seconds of allocations given up after a loss
        self.used_s = 0.0  # node-seconds the steps ran for

    # -- the allocation ------------------------------------------------------------------------

    def ensure_allocation(self, case_id: str) -> None:
        """The allocation, acquired and pre-flighted once; NotStarted when it cannot be had."""
        if self.not_started is not None:  # the queue never gave us the nodes: said once, per case
            raise NotStarted(case_id, None, self.not_started, skip=self.skip_pending)
        if self.lost is not None:
            raise InfrastructureError(case_id, None, self.lost)
        if self.allocation.job_id is not None:
            return
        try:
            self.allocation.acquire()
            self.run_preflight()
        except SlurmError as exc:
            self.allocation.release()
            self.not_started = str(exc)
            raise NotStarted(case_id, None, str(exc), skip=self.skip_pending) from None

    def probe_side(
        self, label: str, python: str, env: Sequence[tuple[str, str]], srun_args: Sequence[str]
    ) -> Any:
        """Side A or B of a paired A/B, probed where its ranks will run: one task in a step of
        the allocation with the side's own srun arguments (its container), so a Python that
        exists only inside the container is found and its torch read there.

        Raises:
            ab.ABInputError: the step or the probe failed (named with srun's words).
        """
        from scaleguard.ranks.protocol import Interpreter
        from scaleguard.schedule import ab

        self.ensure_allocation(f"side {label}")
        out = (self.preflight_dir or Path(".")) / f"probe-{label}-{self.allocation.job_id}"
        out.mkdir(parents=True, exist_ok=True)
        env_all = {**self._env(None), **dict(env)}
        outcome = self.allocation.step(
            [python, "-c", ab.PROBE_CODE], 1, 1, env_all, ab.PROBE_TIMEOUT_S, out / "srun.log", per_node=1,
            extra=tuple(srun_args),
        )  # fmt: skip
        interpreter = Interpreter(python, tuple(env), tuple(srun_args))
        if outcome.state != "COMPLETED" and ab._probe_answer(outcome.output.encode()) is None:
            launched = inert(shlex.join([*srun_args, python]))
            raise ab.ABInputError(
                f"side {label}: the probe step {outcome.step_id} ({launched}) ended "
                f"{outcome.state} (srun exit {outcome.returncode}): "
                + inert(" | ".join(outcome.tail().splitlines()[-4:]))[:800]
            )
        side = ab.side_from_probe(
            label, python, interpreter, outcome.returncode, outcome.output.encode(), b""
        )
        self.allocation.say(
            f"side {label}: {inert(python)} probed in step {outcome.step_id}"
            + (f" with {inert(shlex.join(srun_args))}" if srun_args else "")
            + f": torch {side.versions.get('torch')}"
        )
        return side

    def run_preflight(self) -> None:
        """One task per node of the allocation reports what it sees; mixed or broken nodes
        refuse the allocation (``SlurmError``), a slow or busy node is said."""
        if self.preflight_dir is None:
            return
        from scaleguard.schedule import preflight

        alloc = self.allocation
        out = self.preflight_dir / f"preflight-{alloc.job_id}"
        out.mkdir(parents=True, exist_ok=True)
        nodes = len(alloc.nodelist)
        argv = [self.python, "-m", "scaleguard.schedule.preflight", "--out", str(out)]
        outcome = alloc.step(
            argv, nodes, nodes, self._env(None), PREFLIGHT_TIMEOUT_S, out / "srun.log", per_node=1
        )
        if outcome.returncode != 0 or outcome.state != "COMPLETED":
            task = first_task_error(outcome.output)
            raise SlurmError(
                f"pre-flight step {outcome.step_id} on {','.join(alloc.nodelist)} ended {outcome.state} "
                f"(srun exit {outcome.returncode}){': ' + inert(task) if task else ''}: "
                + inert(" | ".join(outcome.tail().splitlines()[-5:]))[:1500]
            )
        gres = allocated_gres(alloc.job_id or "")
        reports = []
        for node in alloc.nodelist:
            path = out / f"{node}.json"
            try:
                data = read_document(path, "pre-flight report", "a scaleguard bug")
                reports.append(preflight.NodeReport.from_dict(data, gres.get(node), str(path)))
            except FileFormatError as exc:
                raise SlurmError(
                    f"pre-flight: {node}'s report did not reach this node ({exc}): "
                    f"{self.preflight_dir} must be a directory every node and this one share "
                    "(--perf-slurm-dir)"
                ) from None
        try:
            self.preflight = preflight.check(reports, self.device, alloc.resources.gpus_per_node)
        except preflight.PreflightError as exc:
            raise SlurmError(f"pre-flight of allocation {alloc.job_id} refused it: {exc}") from None
        for line in self.preflight.lines():
            alloc.say(line)

    def _renew(self, case_id: str, why: str) -> None:
        """The allocation was lost under a run: give it up, ask once more without its failed
        nodes, or say that the cluster took the night (``InfrastructureError``)."""
        old = self.allocation
        failed = old.failed_nodes()
        job = old.job_id
        old.release()
        self.released_held_s += old.held_s
        old.held_s = 0.0
        if self.retries_left <= 0:
            self.lost = f"Slurm allocation {job} was lost ({why}) and no retry is left (--perf-slurm-retries)"
            raise InfrastructureError(case_id, None, self.lost)
        self.retries_left -= 1
        exclude = tuple(dict.fromkeys((*old.exclude, *failed)))
        old.say(
            f"Slurm allocation {job} lost under {case_id} ({why}); asking for a new one"
            + (f" without {','.join(failed)}" if failed else "")
            + "; the run is measured again there"
        )
        self.allocation = Allocation(old.options, old.nodes, old.name, old.say, old.resources, exclude)
        try:
            self.allocation.acquire()
            self.run_preflight()
        except SlurmError as exc:
            self.allocation.release()
            self.lost = f"Slurm allocation {job} was lost ({why}); the new one failed: {exc}"
            raise InfrastructureError(case_id, None, self.lost) from None

    @property
    def node_seconds_held(self) -> float:
        alloc = self.allocation
        live = (time.monotonic() - alloc.acquired_at) * len(alloc.nodelist) if alloc.job_id else 0.0
        return self.released_held_s + alloc.held_s + live

    # -- one run ---------------------------------------------------------------------------------

    def _env(self, interpreter: Interpreter | None) -> dict[str, str]:
        env = {**os.environ, **dict(self.allocation.options.export)}
        env.update(dict(interpreter.env) if interpreter else {})
        iface = self.allocation.options.iface
        if iface:
            env.update(NCCL_SOCKET_IFNAME=iface, GLOO_SOCKET_IFNAME=iface)
        return env

    def __call__(
        self, spec: CaseSpec, run_dir: Path, timeout_s: float, interpreter: Interpreter | None = None
    ) -> RunRecord:
        """One run as one job step; ``interpreter``: side A or B of ``scaleguard ab`` (same nodes)."""
        self.ensure_allocation(spec.case_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        spec_path = run_dir / "case.json"
        atomic_write_json(spec_path, spec.to_dict())
        nodes = spec.settings.nodes
        python = interpreter.python if interpreter else self.python
        argv = [python, "-m", "scaleguard.schedule.torchrun_entry", "--spec", str(spec_path),
                "--out", str(run_dir)]  # fmt: skip
        port_retried = False
        while True:
            alloc = self.allocation
            env = self._env(interpreter)
            env.update(
                MASTER_ADDR=alloc.head_addr if nodes > 1 else "127.0.0.1",
                MASTER_PORT=str(random.randint(*PORTS)),
                SCALEGUARD_RUN_ID=f"slurm-{alloc.job_id}-{run_dir.name}",
            )
            if spec.device == "cuda" and "NCCL_DEBUG" not in env:
                # the transport NCCL picked between nodes (IB, Socket) goes into the run's record
                env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET")
            try:
                outcome = alloc.step(
                    argv, nodes, spec.nprocs, env, timeout_s, run_dir / "srun.log",
                    extra=interpreter.srun_args if interpreter else (),
                )  # fmt: skip
            except SlurmError as exc:
                raise CaseFailedError(spec.case_id, None, str(exc)) from None
            self.used_s += outcome.wall_s * nodes
            if outcome.returncode == 0 and outcome.state == "COMPLETED":
                return self._record(spec, run_dir, outcome, nodes)
            lost = None if outcome.timed_out else self._lost(outcome)
            if lost is not None:
                self._renew(spec.case_id, lost)
                continue
            if not port_retried and _port_taken(outcome.output):
                port_retried = True
                port = env["MASTER_PORT"]
                alloc.say(f"{spec.case_id}: rendezvous port {port} was taken; the run goes again on another")
                continue
            raise self._failure(spec, run_dir, outcome, timeout_s)

    def _lost(self, outcome: StepOutcome) -> str | None:
        """Why the allocation is gone (its state and Slurm's reason), or None while it runs."""
        alive, said = self.allocation.alive()
        if alive:
            return None
        state = said.split(" ")[0]
        if state == "TIMEOUT":  # the user's --perf-slurm-time: a new allocation would meet it again
            return None
        if state in LOST or outcome.state in LOST or said.startswith("no longer"):
            return f"step {outcome.step_id} {outcome.state}, allocation {said}"
        return None

    def _record(self, spec: CaseSpec, run_dir: Path, outcome: StepOutcome, nodes: int) -> RunRecord:
        from scaleguard.schedule.torchrun_entry import read_finished_record, record_path

        alloc = self.allocation
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
            "tres": alloc.resources.tres(),
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


def _port_taken(output: str) -> bool:
    """The rendezvous failed because its port was in use (the store could not bind)."""
    return "EADDRINUSE" in output or "ddress already in use" in output


def allocated_gres(job_id: str) -> dict[str, str]:
    """The GRES Slurm gave the job on each node (``scontrol show job -d``: "gpu:h100:8(IDX:0-7)")."""
    done = _run(["scontrol", "show", "job", "-d", job_id])
    out: dict[str, str] = {}
    if done.returncode != 0:
        return out
    for line in done.stdout.splitlines():
        match = re.search(r"Nodes=(\S+) .*?GRES=(\S+)", line)
        if match and match.group(2) not in ("", "(null)"):
            for node in hostnames(match.group(1)):
                out[node] = match.group(2)
    return out


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
    # every GPU type the partition lists ("gpu:h100:8", an untyped "gpu:8", several per node);
    # one type names the nodes, several name none (the pre-flight reads what was allocated)
    types: set[str] = set()
    for row in rows:
        for match in re.finditer(r"gpu(?::([A-Za-z][A-Za-z0-9_.-]*))?:(\d+)", row[1]):
            types.add(match.group(1) or "gpu")
    if options.gpu_type:
        types &= {options.gpu_type}
    gpu = next(iter(types)) if len(types) == 1 else ("mixed" if types else None)
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
    threads = matrix.threads_per_rank or options.cpus_per_task or max(1, facts.cpus // rpn)
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
    device: str, gpu_name: str | None, options: SlurmOptions, cpu_model: str, threads: int
) -> str:
    """``slurm-<the per-node key>-<ranks per node>pn``: a cluster's baseline is never a single
    machine's, and the node count is in each case's configuration (``nodes``). ``gpu_name`` and
    ``cpu_model`` are the compute nodes' (the pre-flight's), never the login node's."""
    from scaleguard.evidence.baseline import hardware_key

    rpn = options.ranks_per_node
    return f"slurm-{hardware_key(device, gpu_name, rpn, cpu_model, threads)}-{rpn}pn"
