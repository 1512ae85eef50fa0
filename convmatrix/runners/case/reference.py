"""A case's float64 reference as judging reads it: computed by the oracle, block by block, or
read from the reference cache when computed before.

The one place a case enters the oracle: ``judged_blocks`` asks ``kernels.oracle.steps`` for
the reference of the blocks the cache cannot give (``reference_blocks``, once per case), and
puts each block in its stored form (``refcache.compact``: r, the bound, the slack
magnitudes), whether it was computed now or read.

Channels are independent, so a forward case's reference goes one block of channels at a time,
``BLOCK_ELEMENTS`` elements per tensor at most (``refcache.footprint``; ``channel_blocks``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from convmatrix.core.case import Case
from convmatrix.kernels.oracle.steps import Reference, channels_of, reference_blocks
from convmatrix.runners.case.inputs import ForwardInputs, UpdateInputs
from convmatrix.runners.case.refcache.cache import ReferenceCache
from convmatrix.runners.case.refcache.compact import Expanded, Span, StoredBlock, compact, expand
from convmatrix.runners.case.refcache.footprint import BLOCK_ELEMENTS, channels_per_block
from convmatrix.runners.case.refcache.key import BoundSpec, cache_key

__all__ = [
    "Judged",
    "Reference",
    "channel_blocks",
    "channels_of",
    "judged_blocks",
    "reference_blocks",
]

# Reference values and bounds by output name, both float64: what judging reads.
Judged = Expanded  # r, bound and slack magnitudes per output (``refcache.compact``)


def channel_blocks(case: Case, inputs: ForwardInputs | UpdateInputs) -> list[slice | None]:
    """The channel blocks ``reference_blocks`` yields, ``BLOCK_ELEMENTS`` elements per tensor
    at most (``refcache.footprint``): [None] (all at once) for updates (small, and their
    reference replays the slots) and for cases of one block."""
    if isinstance(inputs, UpdateInputs):
        return [None]
    batch, dim, seqlen = inputs.x.values.shape
    per = channels_per_block(batch, seqlen, case.width, BLOCK_ELEMENTS)
    if per >= dim:
        return [None]
    return [slice(c, min(c + per, dim)) for c in range(0, dim, per)]


def _span(block: slice | None) -> Span:
    return None if block is None else (block.start, block.stop)


def judged_blocks(
    case: Case,
    inputs: ForwardInputs | UpdateInputs,
    blocks: list[slice | None],
    spec: BoundSpec,
    *,
    device: torch.device | None = None,
    cache: ReferenceCache | None = None,
) -> Iterator[tuple[slice | None, Judged]]:
    """(block, (r, bound, slack magnitudes) per output) for each channel block, in float64 on
    ``device``
    (None: the host), from the stored form (``refcache.compact``) whether computed now or
    read from ``cache``. A forward case the cache admits is read from its entry, each block
    checked before it is used; the blocks an entry lacks or fails on are computed, and a
    case not read whole is stored. Update cases are neither moved nor cached: small, and
    their reference replays slots."""
    if cache is None or isinstance(inputs, UpdateInputs) or not cache.admits(case):
        for block, (refs, mags) in reference_blocks(case, inputs, blocks, device=device):
            yield block, compact(case, _span(block), refs, mags, spec)[1]
        return
    spans = [_span(b) for b in blocks]
    where = "cpu" if device is None else device.type
    key = cache_key(case, inputs, spans, spec, where)
    kept: list[StoredBlock] = []
    for stored in cache.read(key, spans):
        kept.append(stored)
        yield blocks[len(kept) - 1], expand(case, stored.to(device))
    if len(kept) == len(blocks):
        return
    rest = reference_blocks(case, inputs, blocks[len(kept) :], device=device)
    for block, (refs, mags) in rest:
        stored, judged = compact(case, _span(block), refs, mags, spec)
        kept.append(stored)
        yield block, judged
    cache.write(key, kept)
