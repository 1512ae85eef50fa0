"""The oracle every kernel is judged against: the float64 reference (``reference``), the
reference of one case step by step (``steps``: the one module the runners call), an independent
scalar reference (``scalar``), and the checks of the oracle itself (``selfcheck``)."""
