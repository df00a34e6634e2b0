"""The one schema version of every file and record scaleguard writes.

History:
  1: one run per case and torch version in baselines; per-step samples only.
  2: runs are first-class: baselines keep the last K accepted runs per case and torch version,
     each with its median, spread, session, date and commit; schema-1 files load as one run
     each and are written back as 2. Run records carry quarantine reasons and a run id.
  3: one run shape from the ranks to the file: a stored run also holds what the ranks saw
     (device name, runtime, settings, memory kind and per-rank peaks, steadiness, notes, the
     GPUs over the whole run), and a torchrun record is ``{spec, run}``; schema-2 runs read
     with those empty, and schema-2 torchrun records (the run's fields beside ``spec``) still read.
  4: a run also holds, per rank, where it ran (``placement``: node, bound CPUs, threads, visible
     devices and GPU UUID, the Slurm step's grant) and its step anatomy's categories
     (``rank_ms``: every rank's compute and wait, so a straggler can be named); schema-3 runs
     read with those empty.
  5: a DDP run also holds what its scaling projection needs (``scaling``: compute phase by phase
     without the all-reduce, when each gradient became ready in the backward, DDP's buckets and
     each bucket's all-reduce timed alone); schema-4 runs read with none.
"""

from __future__ import annotations

SCHEMA_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
