"""The workloads layer: the ``Workload`` contract (``contract``, re-exported as the public
``scaleguard.workload``), the built-in models (``builtins``), the registry of installed and
named workloads (``registry``) and FLOP counting (``flops``).

It imports only ``case`` and ``schema``; torch is imported here, so the front door imports this
layer lazily.
"""
