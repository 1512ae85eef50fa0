"""Where a run's results go: the ``RunStore`` protocol and ``MemoryStore`` (``--no-db``).

The runners never import the database. The controller records through a store handed to it
(``convmatrix.db.run_store.DatabaseStore``: by ``convmatrix.run``, or by the database's pytest
plugin under a plain ``pytest --matrix ...``); ``--no-db`` gets a ``MemoryStore``, which keeps
nothing and cannot resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from convmatrix.core.errors import UsageError
from convmatrix.core.records import CaseResult, RunIdentity, RunMeta

__all__ = ["MemoryStore", "RunStore", "Shard", "StoredRun"]


@dataclass(frozen=True)
class Shard:
    """This process runs shard ``index`` of ``count`` of the run every shard finds by
    ``label`` (``convmatrix run --shard I/N --run-label L``)."""

    index: int
    count: int
    label: str

    def owns(self, case_id: str) -> bool:
        """Whether a case belongs to this shard: by its id (a hash), so shards are disjoint,
        together complete, and agree without talking to each other."""
        return int(case_id, 16) % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class StoredRun:
    """A run a store holds, as much of it as ``--resume`` needs."""

    id: int
    kernel: str
    kernel_spec: str | None  # as given to --kernel, when recorded
    matrix_sources: tuple[str, ...]  # what the run loaded (built-in names or absolute paths)
    done: frozenset[str]  # ids of the cases that already have a result
    identity: RunIdentity | None = None  # kernel and commit, matrix, device kind


class RunStore(Protocol):
    """The controller's only way to keep results (the single writer of a run)."""

    def where(self) -> str | None:
        """Where results go, for people (a database URL with its password redacted)."""
        ...

    def check(self) -> None:
        """Refuse (``ConvmatrixError``, one line) a store the run could not write to, before
        the run starts: a bad URL or path, a foreign or read-only database."""
        ...

    def lookup(self, spec: str) -> StoredRun:
        """The run ``spec`` names (id, ``latest``, label, commit); ``UsageError`` if none."""
        ...

    def sharded(self, label: str) -> StoredRun | None:
        """The run the shards labelled ``label`` write into, if one has started."""
        ...

    def start(
        self, meta: RunMeta, resume: int | None = None, shard: Shard | None = None
    ) -> int | None:
        """Open a new run (or reopen ``resume``; or create or join the run of ``shard``);
        its id, or None when nothing is kept."""
        ...

    def add(self, result: CaseResult) -> None:
        """Keep one result (a store may buffer; ``finish`` flushes)."""
        ...

    def finish(self, status: str) -> Mapping[str, int] | None:
        """Close the run with ``status``; the run's counts by outcome over every session that
        wrote to it (a resumed run's earlier ones included), or None when nothing is kept
        (or the store could not say: ``failure``)."""
        ...

    def failure(self) -> str | None:
        """One line when the store could not keep the run as asked (a database that refused
        past its retry limit: where the results went instead, how to recover them); the run
        then ends ``interrupted`` with the infrastructure exit status."""
        ...

    def run_status(self) -> str | None:
        """The run's status once ``finish`` closed this session: a shard's run stays
        ``running`` until its last shard reports; None when nothing is kept."""
        ...


class MemoryStore:
    """Keeps nothing: the summary counts this session's results (``--no-db``)."""

    def where(self) -> str | None:
        return None

    def check(self) -> None:
        pass

    def lookup(self, spec: str) -> StoredRun:
        raise UsageError("--resume needs the database; drop --no-db")

    def sharded(self, label: str) -> StoredRun | None:
        raise UsageError("--shard needs the shared database; drop --no-db")

    def start(
        self, meta: RunMeta, resume: int | None = None, shard: Shard | None = None
    ) -> int | None:
        return None

    def add(self, result: CaseResult) -> None:
        pass

    def finish(self, status: str) -> Mapping[str, int] | None:
        return None

    def failure(self) -> str | None:
        return None

    def run_status(self) -> str | None:
        return None
