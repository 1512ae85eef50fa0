"""The regression service: the layer between the reports and the commands.

``regressions`` finds regressions in each recorded run (the diff rules of ``reports.diff``
against the previous comparable run) and keeps their lifecycle in the database; ``ci`` writes
JUnit XML and the markdown summary CI shows; ``confirm`` decides confirmed or flaky from a
rerun; ``bisect`` drives ``git bisect run``; ``transfer`` moves runs as JSON lines; ``app``
serves the report pages live (Starlette). See docs/regressions.md.
"""
