"""The matrix language on small fixture matrices: symbols, rules, includes, packing,
expected errors, settings (tolerances, policy, timing) and the CLI's JSON-lines output."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
from pathlib import Path

import pytest

from convmatrix.commands.expand import expand_command
from convmatrix.matrix import DEFAULT_TOLERANCES, MatrixError, expand_matrix, load_matrix
from convmatrix.matrix.symbols import parse_expr
from convmatrix.matrix.values import Packing, resolve_packing

RES = Path(__file__).parent / "resources" / "matrices"
GEO = {"tile": 16, "ctile": 8, "vec": 4}  # the geometry written in rules.yaml


def test_expressions_resolve_per_width_and_geometry():
    allowed = ("K", "tile", "ctile", "vec", "P")
    assert parse_expr("2 * tile + 1", allowed).eval({"tile": 64}) == 129
    assert parse_expr("K-1", allowed).eval({"K": 4}) == 3
    assert parse_expr("(ctile+1)//2", allowed).eval({"ctile": 32}) == 16
    assert parse_expr("2 * tile + 1", allowed).text == "2*tile+1"
    for bad, words in [("tile/2", "'//'"), ("K**2", "only integers"), ("til", "did you mean")]:
        with pytest.raises(ValueError, match=words):
            parse_expr(bad, allowed)


def test_packing_boundaries_and_lengths():
    env = {"L": 20, "tile": 8, "K": 4}
    assert resolve_packing(Packing(at=(8,), pad=3), env) == (8, 9, -3)
    assert resolve_packing(Packing(lengths=(5, -2, 13)), env) == (5, -2, 13)
    with pytest.raises(ValueError, match="sum"):
        resolve_packing(Packing(lengths=(5, 5)), env)
    with pytest.raises(ValueError, match="strictly inside"):
        resolve_packing(Packing(at=(18,), pad=3), env)


def _oracle_fwd_cases() -> list[dict]:
    """rules.yaml's fwd suite enumerated by hand: the semantics the matrix file states."""
    tile, ctile, vec = GEO["tile"], GEO["ctile"], GEO["vec"]
    found = []
    packings = {
        "none": lambda seqlen: None,
        "at": lambda seqlen: (tile - 1, seqlen - tile, -1) if seqlen - tile >= 1 else "invalid",
        "lengths": lambda seqlen: (3, -2, tile - 4) if 3 + 2 + tile - 4 == seqlen else "invalid",
    }
    for width, seqlen_sym, dim, layout, init, pack in itertools.product(
        (2, 4),
        ("K-1", "tile+1"),
        (vec + 1, ctile),
        ("channel_first", "channel_last"),
        ("none", "random"),
        packings,
    ):
        seqlen = width - 1 if seqlen_sym == "K-1" else tile + 1
        seq_lens = packings[pack](seqlen)
        if seq_lens == "invalid":
            continue
        if layout == "channel_first" and init == "random":  # exclude
            continue
        if seq_lens is not None and layout != "channel_last":  # constraint
            continue
        found.append(
            dict(
                width=width,
                seqlen=seqlen,
                dim=dim,
                layout=layout,
                initial_state=init,
                seq_lens=seq_lens,
            )
        )
    return found


def test_full_strategy_applies_excludes_constraints_and_include():
    expansion = expand_matrix(load_matrix(str(RES / "rules.yaml")))
    fwd = [c for c in expansion.cases if c.suite == "fwd"]
    keys = ("width", "seqlen", "dim", "layout", "initial_state", "seq_lens")
    got = [{k: getattr(c, k) for k in keys} for c in fwd]
    expected = _oracle_fwd_cases()
    # include: width 3, seqlen 2, first value of every other dimension
    expected.append(
        dict(
            width=3,
            seqlen=2,
            dim=GEO["vec"] + 1,
            layout="channel_last",
            initial_state="random",
            seq_lens=None,
        )
    )
    assert got == expected
    assert expansion.counts["fwd"] == len(expected)


def test_checks_only_where_they_apply():
    expansion = expand_matrix(load_matrix(str(RES / "rules.yaml")))
    for case in expansion.cases:
        if case.suite != "fwd":
            continue
        live = sum(1 for n in case.seq_lens or () if n > 0)
        assert ("packed_isolation" in case.checks) == (live >= 2)
        assert ("causality" in case.checks) == (case.seqlen >= 2)


def test_update_fields_and_contract_classification():
    expansion = expand_matrix(load_matrix(str(RES / "rules.yaml")))
    upd = [c for c in expansion.cases if c.suite == "upd"]
    assert upd
    for case in upd:
        assert case.seqlen is None and case.initial_state is None and case.seq_lens is None
        assert not (case.slots == "permuted_pad" and case.batch < 2)
        short = case.state_len < case.width - 1
        assert (case.expect == "error") == short
        if short:
            # classified by docs/spec.md §2, identity of the plain case kept
            assert "state_len" in case.expect_reason
            plain = dataclasses.replace(case, expect="ok", expect_reason=None, id="")
            assert case.id == plain.id


def test_symbols_follow_the_kernel_geometry():
    from convmatrix.kernels import Capabilities, Geometry, KernelBase

    class Tiny(KernelBase):
        name = "tiny"
        capabilities = Capabilities(geometry=Geometry(time_tile=8))

    spec = load_matrix(str(RES / "rules.yaml"))
    default = {c.seqlen for c in expand_matrix(spec).cases if c.suite == "fwd"}
    declared = {c.seqlen for c in expand_matrix(spec, Tiny()).cases if c.suite == "fwd"}
    assert GEO["tile"] + 1 in default and 17 not in declared and 9 in declared


def test_settings_are_read_with_defaults():
    expansion = expand_matrix(load_matrix(str(RES / "settings.yaml")))
    assert expansion.tolerances.lookup("bfloat16", "dw").rel == 0.3
    assert (
        expansion.tolerances.lookup("bfloat16", "y").norm
        == DEFAULT_TOLERANCES[("bfloat16", "y")].norm
    )
    assert expansion.tolerances.lookup("float32", "dx") == DEFAULT_TOLERANCES[("float32", "dx")]
    assert (expansion.policy.rule, expansion.policy.factor, expansion.policy.floor) == (
        "threshold_or_framework",
        3.0,
        1e-6,
    )
    assert expansion.timeout_s == 30
    assert (expansion.timing.warmup, expansion.timing.repeats) == (1, 4)
    assert expansion.timing.suites == ("perf",)
    assert all(c.timed == (c.suite == "perf") for c in expansion.cases)
    perf = [(c.x_dtype, c.w_dtype) for c in expansion.cases if c.suite == "perf"]
    assert perf == [("float32", "float32"), ("bfloat16", "float32"), ("float16", "bfloat16")]


def test_rule_values_must_exist(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "suites:\n  s:\n    op: fwd\n    dimensions: {width: [2], seqlen: [4, 8], dim: [2]}\n"
        "    exclude: [{seqlen: 16}]\n",
        encoding="utf-8",
    )
    with pytest.raises(MatrixError, match=r"m.yaml:5:24: suites.s.exclude\[0\].seqlen: '16'"):
        load_matrix(str(path))


def test_jsonl_has_every_documented_key():
    out = io.StringIO()
    assert expand_command(str(RES / "rules.yaml"), fmt="jsonl", out=out) == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    keys = [
        "id",
        "suite",
        "op",
        "width",
        "seqlen",
        "dim",
        "batch",
        "layout",
        "gap",
        "activation",
        "bias",
        "x_dtype",
        "w_dtype",
        "initial_state",
        "final_state",
        "dfinal",
        "seq_lens",
        "tokens",
        "steps",
        "state_len",
        "circular",
        "slots",
        "expect",
    ]
    for record in records:
        assert set(keys) <= set(record)
        assert record["op"] in ("fwd", "fwd_bwd", "update")
        assert record["expect"] in ("ok", "error")
        assert not record["x_dtype"].startswith("torch.")
        if record["op"] == "update":
            assert record["seqlen"] is None and record["tokens"] >= 1
        else:
            assert record["tokens"] is None and record["seqlen"] >= 1
    assert len({r["id"] for r in records}) == len(records)


def test_a_kernel_geometry_may_drop_values_the_matrix_geometry_allows():
    """nightly is consistent under its own geometry; vec=1 makes 'vec-1' (0 channels)
    impossible: dropped for that kernel and reported, not a matrix error."""
    from convmatrix.kernels import Capabilities, Geometry, KernelBase

    class Scalar(KernelBase):
        name = "scalar-lanes"
        capabilities = Capabilities(geometry=Geometry(time_tile=4, channel_tile=1, vector_width=1))

    expansion = expand_matrix(load_matrix("nightly"), Scalar())
    assert expansion.notes and all("vec-1" in note for note in expansion.notes)
    assert min(c.dim for c in expansion.cases) >= 1
    # the same value is fatal when the matrix's own geometry already rules it out
    with pytest.raises(MatrixError, match="no valid case has packed"):
        expand_matrix(load_matrix(str(RES / "bad_packing.yaml")), Scalar())
