"""The history layer: nights of runs in SQLite (``database``), change points over them
(``changepoints``: pure statistics, no storage) and exports to other tools (``export``).

It may import the evidence layer and everything below it, never the report, the scheduler or
the ranks.
"""
