"""Running a matrix, by role; each role imports only the roles before it (tests/test_roles.py):

- ``case``: one case — its tensors (``inputs``), the kernel's call (``invoke``), the case's
  float64 reference through the oracle and the reference cache (``reference``, ``refcache``),
  metrics and bound usage, property checks, guards, peak memory, phases, timing, and
  ``execute.run_case``, which judges it;
- ``run``: one run — ``controller`` (prepared once, recording every result), the ``RunStore``
  and shards, the account, progress, provenance, device placement, the thread policy, the
  workload; with ``options`` (what a person asked for, checked), which stays here;
- ``executors``: how a run's cases reach devices — ``xdist`` (one pytest session: the
  executor, its pytest plugin, the controller's session, hooks, the watchdog) and ``ray``
  (device actors running cases in a child process: ``isolated``).
"""
