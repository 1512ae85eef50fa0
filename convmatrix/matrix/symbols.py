"""Symbolic values: ``K-1``, ``tile+1``, ``2*tile+1``, ``vec-1``, ``ctile+1``, ``L//2`` ...

A matrix names lengths and channel counts relative to the case's width and to the tile
geometry the kernel declares (docs/spec.md §3), so one matrix probes each kernel's own boundaries.
Expressions are integer arithmetic (``+ - * //``, parentheses) over these symbols, parsed
once at load time (unknown names are a load error) and evaluated per case.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

from convmatrix.matrix.errors import did_you_mean

__all__ = ["GEOMETRY_SYMBOLS", "SYMBOL_HELP", "Expr", "UnresolvedSymbol", "parse_expr"]

# Symbols taken from the kernel's Geometry.symbols() (or the matrix's ``geometry:`` defaults).
GEOMETRY_SYMBOLS = ("tile", "ctile", "vec", "P")
SYMBOL_HELP = {
    "K": "the case's width",
    "L": "the case's seqlen (packed boundaries only)",
    "tile": "time tile T",
    "ctile": "channel tile C_t",
    "vec": "channel vector width",
    "P": "partial groups of dw/db",
}

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
}


class UnresolvedSymbol(LookupError):
    """An expression uses a symbol the environment does not define (e.g. no declared tile)."""

    def __init__(self, symbol: str) -> None:
        self.symbol = symbol
        super().__init__(symbol)


@dataclass(frozen=True)
class Expr:
    """A parsed expression; ``text`` is its whitespace-free spelling (its identity)."""

    text: str
    names: tuple[str, ...]
    tree: ast.expr = field(compare=False, repr=False)

    def eval(self, env: Mapping[str, int]) -> int:
        return _eval(self.tree, env)

    def __str__(self) -> str:
        return self.text


def _eval(node: ast.expr, env: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant):
        return int(node.value)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise UnresolvedSymbol(node.id)
        return int(env[node.id])
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        return -value if isinstance(node.op, ast.USub) else value
    assert isinstance(node, ast.BinOp)
    right = _eval(node.right, env)
    if isinstance(node.op, ast.FloorDiv) and right == 0:
        raise ZeroDivisionError("division by zero")
    return _BINOPS[type(node.op)](_eval(node.left, env), right)


def _check(node: ast.AST, allowed: tuple[str, ...], names: list[str]) -> None:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise ValueError(f"only integer constants are allowed, got {node.value!r}")
    elif isinstance(node, ast.Name):
        if node.id not in allowed:
            hint = did_you_mean(node.id, allowed) or f" (symbols: {', '.join(allowed)})"
            raise ValueError(f"unknown symbol {node.id!r}{hint}")
        if node.id not in names:
            names.append(node.id)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _check(node.operand, allowed, names)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        _check(node.left, allowed, names)
        _check(node.right, allowed, names)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        raise ValueError("use '//' (integer division), not '/'")
    else:
        raise ValueError("only integers, symbols, + - * // and parentheses are allowed")


def parse_expr(text: str, allowed: tuple[str, ...]) -> Expr:
    """Parse ``text`` allowing the symbols ``allowed``; ValueError with a readable reason."""
    compact = "".join(str(text).split())
    if not compact:
        raise ValueError("empty expression")
    try:
        tree = ast.parse(compact, mode="eval").body
    except SyntaxError:
        raise ValueError(f"cannot parse expression {compact!r}") from None
    names: list[str] = []
    _check(tree, allowed, names)
    return Expr(compact, tuple(names), tree)
