"""The schedule layer: which cases run, in what order, and where.

``matrix`` plans the cases, ``runner`` runs one case's runs, ``session`` the repeats and
confirm runs, ``ab`` and ``bisect`` alternate two torch installs, ``torchrun_entry`` runs a case
under an external launcher. It may import every layer below it (ranks, evidence, machine,
workloads), never the report's internals or the pytest plugin.
"""
