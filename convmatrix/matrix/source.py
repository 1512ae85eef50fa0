"""Safe YAML loading that remembers where every node came from.

PyYAML's ``safe_load`` returns plain values and forgets positions. We compose the node graph
with a ``yaml.SafeLoader`` subclass instead and convert it into ``YNode`` values that carry
their mark (file:line:col) and key path, so every later validation error can name them.
Only the YAML core tags (map, seq, str, int, float, bool, null) are accepted: no object
construction, no timestamps or binary blobs. Merge keys (``<<: *defaults``) work; duplicate
keys, which PyYAML silently resolves to the last one, are an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from convmatrix.matrix.errors import Mark, MatrixError, did_you_mean

__all__ = ["YNode", "load_yaml"]

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "null"))
_MAP_TAG, _SEQ_TAG, _MERGE_TAG = _TAG + "map", _TAG + "seq", _TAG + "merge"
_MAX_NODES = 200_000  # alias bombs ("billion laughs") stop here
MAX_DEPTH = 32  # levels of nesting; a matrix uses about 6


class _MarkingLoader(yaml.SafeLoader):
    """SafeLoader used only to compose nodes (which carry start marks) and build scalars."""


@dataclass
class YNode:
    """A YAML value with its position. ``value`` is a dict of YNode, a list of YNode or a
    scalar; ``key_marks`` holds, for a mapping, where each key was written."""

    value: Any
    mark: Mark
    path: str
    key_marks: dict[str, Mark] = field(default_factory=dict)

    # -- shape ---------------------------------------------------------------------------
    @property
    def is_map(self) -> bool:
        return isinstance(self.value, dict)

    @property
    def is_list(self) -> bool:
        return isinstance(self.value, list)

    def items(self) -> Iterator[tuple[str, YNode]]:
        return iter(self.value.items())

    def get(self, key: str) -> YNode | None:
        return self.value.get(key) if self.is_map else None

    def plain(self) -> Any:
        """The value without positions (for hashing rule values and messages)."""
        if self.is_map:
            return {k: v.plain() for k, v in self.value.items()}
        if self.is_list:
            return [v.plain() for v in self.value]
        return self.value

    # -- errors --------------------------------------------------------------------------
    def error(self, message: str) -> MatrixError:
        return MatrixError(self.mark, self.path, message)

    def key_error(self, key: str, message: str) -> MatrixError:
        return MatrixError(self.key_marks.get(key, self.mark), _join(self.path, key), message)

    def expect_map(self, what: str) -> YNode:
        if not self.is_map:
            raise self.error(f"{what} must be a mapping, got {_kind(self.value)}")
        return self

    def expect_list(self, what: str) -> YNode:
        if not self.is_list:
            raise self.error(f"{what} must be a list, got {_kind(self.value)}")
        return self

    def check_keys(self, allowed: list[str] | tuple[str, ...], required: tuple[str, ...] = ()):
        """Unknown keys get a did-you-mean; missing required keys name the mapping."""
        for key in self.value:
            if key not in allowed:
                hint = did_you_mean(key, allowed) or f" (known keys: {', '.join(allowed)})"
                raise self.key_error(key, f"unknown key{hint}")
        for key in required:
            if key not in self.value:
                raise self.error(f"missing required key {key!r}")


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def _mark(file: str, node: yaml.Node) -> Mark:
    return Mark(file, node.start_mark.line + 1, node.start_mark.column + 1)


class _Converter:
    def __init__(self, loader: _MarkingLoader, file: str) -> None:
        self.loader, self.file, self.count = loader, file, 0
        self.stack: list[int] = []

    def convert(self, node: yaml.Node, path: str) -> YNode:
        mark = _mark(self.file, node)
        self.count += 1
        if self.count > _MAX_NODES:
            raise MatrixError(mark, path, f"more than {_MAX_NODES} nodes (alias expansion?)")
        if len(self.stack) >= MAX_DEPTH:
            raise MatrixError(mark, path, f"nested more than {MAX_DEPTH} levels deep")
        if id(node) in self.stack:
            raise MatrixError(mark, path, "recursive alias")
        if node.tag not in _SCALAR_TAGS | {_MAP_TAG, _SEQ_TAG}:
            raise MatrixError(
                mark, path, f"tag {node.tag!r} is not allowed (matrices are loaded safely)"
            )
        self.stack.append(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, mark, path)
            if isinstance(node, yaml.SequenceNode):
                items = [self.convert(n, _join(path, i)) for i, n in enumerate(node.value)]
                return YNode(items, mark, path)
            return YNode(self.loader.construct_object(node, deep=True), mark, path)
        except yaml.MarkedYAMLError as exc:
            raise _syntax_error(self.file, exc) from None
        finally:
            self.stack.pop()

    def _flatten(self, node: yaml.MappingNode, path: str, depth: int = 0) -> tuple[list, list]:
        """(merged pairs, explicit pairs) of a mapping, without PyYAML's in-place rewrite.

        Merge keys (``<<: *a`` or ``<<: [*a, *b]``): earlier sources win over later ones, so
        merged pairs are listed last source first and later entries override earlier ones.
        """
        if depth > 50:
            raise MatrixError(_mark(self.file, node), path, "merge keys nest too deep")
        merged: list = []
        explicit: list = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                explicit.append((key_node, value_node))
                continue
            sources = (
                value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            )
            for source in reversed(sources):
                if not isinstance(source, yaml.MappingNode):
                    raise MatrixError(
                        _mark(self.file, source), path, "'<<' merges mappings (or a list of them)"
                    )
                inner_merged, inner_explicit = self._flatten(source, path, depth + 1)
                merged += inner_merged + inner_explicit
        return merged, explicit

    def _mapping(self, node: yaml.MappingNode, mark: Mark, path: str) -> YNode:
        merged, explicit = self._flatten(node, path)
        out: dict[str, YNode] = {}
        key_marks: dict[str, Mark] = {}
        explicit_seen: dict[str, Mark] = {}
        for position, (key_node, value_node) in enumerate(merged + explicit):
            key_mark = _mark(self.file, key_node)
            key = self.convert(key_node, path).value if key_node.tag in _SCALAR_TAGS else None
            if not isinstance(key, str):
                raise MatrixError(key_mark, path, f"keys must be strings, got {_kind(key)}")
            if position >= len(merged):
                if key in explicit_seen:
                    raise MatrixError(
                        key_mark,
                        _join(path, key),
                        f"duplicate key (first at line {explicit_seen[key].line})",
                    )
                explicit_seen[key] = key_mark
            key_marks[key] = key_mark
            out[key] = self.convert(value_node, _join(path, key))
        return YNode(out, mark, path, key_marks)


def _syntax_error(file: str, exc: yaml.MarkedYAMLError) -> MatrixError:
    pos = exc.problem_mark or exc.context_mark
    mark = Mark(file, pos.line + 1, pos.column + 1) if pos else Mark(file, 1, 1)
    message = " ".join(str(p) for p in (exc.context, exc.problem) if p)
    return MatrixError(mark, "(syntax)", f"invalid YAML: {message}")


def load_yaml(text: str, file: str) -> YNode:
    """Parse ``text`` (from ``file``, for messages) into a position-carrying tree."""
    try:
        loader = _MarkingLoader(text)  # reads the first characters: may raise ReaderError
    except yaml.YAMLError as exc:
        raise MatrixError(Mark(file, 1, 1), "(syntax)", f"invalid YAML: {exc}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise MatrixError(Mark(file, 1, 1), "(document)", "the matrix file is empty")
        return _Converter(loader, file).convert(node, "")
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(file, exc) from None
    except yaml.YAMLError as exc:
        raise MatrixError(Mark(file, 1, 1), "(syntax)", f"invalid YAML: {exc}") from None
    except RecursionError:  # PyYAML's composer recurses once per level of nesting
        raise MatrixError(
            Mark(file, 1, 1), "(document)", f"nested more than {MAX_DEPTH} levels deep"
        ) from None
    finally:
        loader.dispose()
