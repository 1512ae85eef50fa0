"""The reference, computed once: entries of r and the bound per output, keyed by everything
that decides them, checked on every read, bounded in size (docs/devices.md, "The reference
cache").

- ``directory``: where the cache lives, its files, eviction, clearing, counters (no torch);
- ``footprint``: what an entry holds and weighs, the admission of a run's cases (no torch);
- ``key``: an entry's key; ``compact``: the stored form, which every case is judged from;
- ``entry``: an entry's file; ``cache``: ``ReferenceCache``, what a run reads and writes.

The names below import their module on first use: ``convmatrix cache`` never loads torch.
"""

from __future__ import annotations

from convmatrix.core.lazy import lazy_attributes

__all__ = [
    "DEFAULT_LIMIT_BYTES",
    "REFERENCE_VERSION",
    "Admission",
    "BoundSpec",
    "CacheDir",
    "ReferenceCache",
    "StoredBlock",
    "admit",
    "cache_directory",
    "cache_key",
    "compact",
    "entry_bytes",
    "expand",
]

_WHERE = {
    "DEFAULT_LIMIT_BYTES": "directory",
    "CacheDir": "directory",
    "cache_directory": "directory",
    "Admission": "footprint",
    "admit": "footprint",
    "entry_bytes": "footprint",
    "REFERENCE_VERSION": "key",
    "BoundSpec": "key",
    "cache_key": "key",
    "StoredBlock": "compact",
    "compact": "compact",
    "expand": "compact",
    "ReferenceCache": "cache",
}
__getattr__ = lazy_attributes(__name__, {k: f"{__name__}.{v}" for k, v in _WHERE.items()})
