"""The run pipeline: what happens to a recorded run, below the commands and above the service.

``run.run(options)`` takes one run through its named steps (prepare, execute, scan, confirm,
report, CI outputs) over one database engine; ``confirm.confirm_run`` reruns a run's new
regressions; ``adequacy.measure`` runs every seeded bug through a matrix. The commands parse
arguments, call one of these, and print what comes back.
"""
