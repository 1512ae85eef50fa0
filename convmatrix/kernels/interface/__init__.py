"""The kernel API: what a kernel implements (``protocol``), the argument contracts and state
bookkeeping of docs/spec.md §2 every kernel and the oracle share (``semantics``), finding kernels
by name or ``package.module:attribute`` (``registry``), and the optional core-only call the
``kernel`` timing scope uses (``corecall``)."""
