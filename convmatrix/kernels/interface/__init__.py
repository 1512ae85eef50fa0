"""The kernel API: what a kernel implements (``protocol``), finding kernels by name or
``package.module:attribute`` (``registry``), and the optional core-only call the ``kernel``
timing scope uses (``corecall``)."""
