"""The evidence layer: what a run measured, as data, and the one decision over it.

Owns the leaf reader (``files``: every file read or written, bounded JSON, ``Fields``, atomic
writes; older files' ``upgrades``), the run's records from the rank to the file (``records``,
``runs``), steady-state and statistics (``steady``, ``stats``, ``anatomy``), throughput,
speedup, efficiency, bus bandwidth and MFU (``metrics``), thresholds and the verdict
(``verdict``), and where evidence is kept (``baseline``, ``ledger``, ``benchmark_io``). It
imports only ``schema``, ``case``, ``machine`` and ``workloads``: nothing here launches a rank,
draws a table or plans a session, so every reader of a file can use it.
"""
