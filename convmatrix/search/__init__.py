"""Beyond the matrix: cases no matrix listed, each judged as ``convmatrix run`` judges one.

``probe.Probe`` runs one candidate case at a time on a run's kernel, device and policy (the
same ``run_case`` and verdict as a run); ``shrink.shrink`` walks a failing case down to the
simplest one that still fails the same way; ``explore`` draws cases from the whole space of
docs/spec.md. Layered just above ``runners`` (it runs cases) and below the database: storing
what a search found is the pipeline's. docs/search.md.
"""

from convmatrix.core.lazy import lazy_attributes

__all__ = ["Probe", "ProbeOutcome", "ShrinkResult", "shrink"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "Probe": "convmatrix.search.probe",
        "ProbeOutcome": "convmatrix.search.probe",
        "ShrinkResult": "convmatrix.search.shrink",
        "shrink": "convmatrix.search.shrink",
    },
)
