"""The oracle every kernel is judged against: the float64 reference (``reference``), an
independent scalar reference (``scalar``), the argument contracts and state bookkeeping of
docs/spec.md §2 (``semantics``), and the checks of the oracle itself (``selfcheck``)."""
