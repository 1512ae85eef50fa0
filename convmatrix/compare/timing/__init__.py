"""Timing regressions from stored timings (no torch, no I/O): ``pairs`` judges two runs timing
by timing, ``pooled`` the pair as a whole, ``history`` a baseline window against confirming
runs; ``rules`` holds their parameters. Measuring lives in ``convmatrix.runners.case.timing``."""
