"""The rank layer: what runs inside a rank process and how the parent starts and reaps it.

``launcher`` spawns ranks and pools with deadlines, ``worker`` trains and measures one rank,
``timing`` holds the clocks (CUDA events, ``perf_counter``), ``collective`` the all-reduce
benchmark, ``faults`` the injected faults. Ranks report through files written with the
evidence layer's records; this layer may import evidence, workloads, machine and below, never
the scheduler, the report or the pytest plugin.
"""
