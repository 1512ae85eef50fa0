"""Property checks besides the numeric comparison (docs/spec.md §3), kernel against itself.

- guards: the storage around every view is still NaN, inputs hold their values, and an update
  touched no pool row that no slot names;
- causality: changing only future inputs ``x[t+1:]`` leaves ``y[:t+1]`` unchanged;
- packed isolation: changing every other packed sample leaves the samples between unchanged;
- chunk consistency: two chunks with the state carried across (and its gradient flowing back)
  equal one whole call, forward and backward.

The comparisons use the case's tolerance rows at twice their limits: both sides carry the
kernel's own rounding, so an honest kernel differs from itself by at most the sum. A leak
moves outputs by O(1) of the data scale, far above any row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from convmatrix.core.case import Case
from convmatrix.core.contract import Capabilities
from convmatrix.core.records import PropertyResult
from convmatrix.core.tolerances import Tolerances
from convmatrix.core.verdict import tolerance_for
from convmatrix.runners.applicability import not_applicable, refused_call, split_point
from convmatrix.runners.inputs import ForwardInputs, UpdateInputs, build_forward, place
from convmatrix.runners.invoke import KernelFault, call_forward, grads
from convmatrix.runners.metrics import error_metrics

__all__ = ["PROPERTIES", "check_guards", "run_properties", "run_property"]


def check_guards(
    inputs: ForwardInputs | UpdateInputs, contract: Capabilities | None = None
) -> PropertyResult:
    """Gaps still NaN, inputs unchanged, unnamed pool rows unchanged. An update that declares
    y written into x (``contract.inplace_y``) may change x's values, never its gaps."""
    update = isinstance(inputs, UpdateInputs)
    y_in_x = update and "update" in (contract or Capabilities()).inplace_y
    problems = [p for g in inputs.guarded() if (p := g.gap_damage())]
    for g in inputs.guarded():
        if update and g is inputs.pool:
            rows = [r for r in range(g.values.shape[0]) if r not in inputs.named_rows]
            problem = g.value_damage(rows) if rows else None
        elif y_in_x and any(g is x for x in inputs.xs):
            problem = None
        else:
            problem = g.value_damage()
        if problem:
            problems.append(problem)
    return PropertyResult("guards", not problems, "; ".join(problems))


def _same(
    name: str, a: torch.Tensor, b: torch.Tensor, tol: Tolerances, case: Case, output: str
) -> str | None:
    """None when ``a`` matches ``b`` within twice the (dtype, output) row, else why not."""
    if a.numel() == 0:
        return None
    limit = tolerance_for(tol, case, output)
    m = error_metrics(a, b)
    if m.e_rel <= 2 * limit.rel and m.e_norm <= 2 * limit.norm:
        return None
    return (
        f"{name}: {output} differs by e_rel {m.e_rel:.3g} (allowed {2 * limit.rel:.3g}), "
        f"max|diff| {m.e_abs:.3g} at {m.worst_index}"
    )


def _forward(kernel: Any, case: Case, fi: ForwardInputs, x: torch.Tensor | None = None):
    return call_forward(
        kernel,
        case,
        fi.x.view if x is None else x,
        fi.weight.view,
        None if fi.bias is None else fi.bias.view,
        None if fi.initial_state is None else fi.initial_state.view,
        fi.seq_idx,
        False,
    )[0]


def _replace_x(case: Case, fi: ForwardInputs, mask: torch.Tensor, device) -> torch.Tensor:
    """A view (same layout/gap) of x whose tokens under ``mask`` (B, 1|C, L) are changed."""
    changed = torch.where(mask, 1.5 - 2.0 * fi.x.values.float(), fi.x.values.float())
    return place("x'", changed.to(fi.x.values.dtype), device, case.layout, case.gap).view


def causality(kernel: Any, case: Case, tol: Tolerances, device: torch.device) -> PropertyResult:
    fi = build_forward(case, device)
    length = fi.x.values.shape[2]
    cut = length // 2  # keep y[:cut+1], change x[cut+1:]
    with torch.no_grad():
        before = _forward(kernel, case, fi)
        future = torch.arange(length) > cut
        after = _forward(kernel, case, fi, _replace_x(case, fi, future[None, None, :], device))
    problem = _same(
        f"changing x[{cut + 1}:]", after[..., : cut + 1], before[..., : cut + 1], tol, case, "y"
    )
    return PropertyResult("causality", problem is None, problem or f"y[:{cut + 1}] unchanged")


def packed_isolation(
    kernel: Any, case: Case, tol: Tolerances, device: torch.device
) -> PropertyResult:
    """Change the even-numbered samples (and the state, which belongs to sample 0); the
    odd-numbered samples' outputs must not move."""
    fi = build_forward(case, device)
    assert fi.seq_idx is not None
    ids = fi.seq_idx[0].cpu()
    changed = (ids >= 0) & (ids % 2 == 0)
    kept = (ids >= 0) & (ids % 2 == 1)
    if not bool(kept.any()):
        return PropertyResult("packed_isolation", True, "only one sample: nothing to isolate")
    with torch.no_grad():
        before = _forward(kernel, case, fi)
        after = _forward(kernel, case, fi, _replace_x(case, fi, changed[None, None, :], device))
    problem = _same("changing even samples", after[..., kept], before[..., kept], tol, case, "y")
    return PropertyResult("packed_isolation", problem is None, problem or "odd samples unchanged")


def chunk_consistency(
    kernel: Any, case: Case, tol: Tolerances, device: torch.device
) -> PropertyResult:
    fi = build_forward(case, device)
    ids = None if fi.seq_idx is None else fi.seq_idx[0].cpu()
    s = split_point(case, ids, fi.x.values.shape[2])
    if s is None:
        return not_applicable("chunk_consistency", "no split inside a sample")
    backward = case.op == "fwd_bwd"
    state = (
        fi.initial_state.view
        if fi.initial_state is not None
        else torch.zeros(
            fi.x.values.shape[0],
            fi.x.values.shape[1],
            case.width - 1,
            dtype=fi.x.values.dtype,
            device=device,
        )
    )
    params = {"dx": fi.x.view, "dw": fi.weight.view, "dS": state}
    if fi.bias is not None:
        params["db"] = fi.bias.view
    for p in params.values():
        p.requires_grad_(backward)
    bias = None if fi.bias is None else fi.bias.view
    seq = fi.seq_idx

    def fwd(x, init, sidx):
        return call_forward(kernel, case, x, fi.weight.view, bias, init, sidx, True)

    with torch.set_grad_enabled(backward):
        whole = fwd(fi.x.view, state, seq)
        y1, f1 = fwd(fi.x.view[..., :s], state, None if seq is None else seq[:, :s])
        y2, f2 = fwd(fi.x.view[..., s:], f1, None if seq is None else seq[:, s:])
        chunked = (torch.cat([y1, y2], dim=2), f2)
    problems = [
        _same(f"chunks {s}+{fi.x.values.shape[2] - s}", c.detach(), w.detach(), tol, case, name)
        for name, c, w in zip(("y", "F"), chunked, whole, strict=True)
    ]
    if backward:
        q = fi.q if fi.q is not None else torch.zeros(state.shape, dtype=state.dtype)
        g_whole = grads(list(whole), [fi.g, q], params)
        g_chunk = grads(list(chunked), [fi.g, q], params)
        problems += [
            _same(f"chunks {s}+{fi.x.values.shape[2] - s}", g_chunk[k], g_whole[k], tol, case, k)
            for k in params
        ]
    bad = [p for p in problems if p]
    return PropertyResult("chunk_consistency", not bad, "; ".join(bad) or f"split at {s} agrees")


PROPERTIES: dict[str, Callable[[Any, Case, Tolerances, torch.device], PropertyResult]] = {
    "causality": causality,
    "packed_isolation": packed_isolation,
    "chunk_consistency": chunk_consistency,
}


def run_property(
    name: str, kernel: Any, case: Case, tol: Tolerances, device: torch.device
) -> PropertyResult:
    """One check, only if the kernel's contract accepts every call it makes (else not
    applicable, with the reason); a kernel that raises fails this check alone, by name."""
    refused = refused_call(kernel, name, case)
    if refused:
        return not_applicable(name, refused)
    try:
        return PROPERTIES[name](kernel, case, tol, device)
    except KernelFault as exc:
        return PropertyResult(name, False, str(exc))


def run_properties(
    kernel: Any, case: Case, tol: Tolerances, device: torch.device
) -> list[PropertyResult]:
    """The property checks ``case.checks`` asks for that apply to its op, each recorded.

    Updates are already compared token by token against the whole-history forward, which is
    their chunk consistency; forward-only properties do not apply to them.
    """
    if case.op == "update":
        return []
    checks = [c for c in case.checks if c != "packed_isolation" or case.seq_lens is not None]
    return [run_property(name, kernel, case, tol, device) for name in checks]
