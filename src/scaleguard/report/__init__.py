"""The report layer: renderers only. ``terminal`` draws tables and stories for the terminal and
markdown, ``page`` the self-contained HTML page of the history.

Renderers take values computed below (verdicts, metrics, the outcome of a baseline update) and
return text; they never write a baseline, pick an exit code or import a workload.
"""
