"""The shipped matrices and the properties every expansion must have: coverage of docs/spec.md §3,
unique and stable ids, identical expansion in every process, kernel-classified errors."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from convmatrix.kernels import Capabilities, Geometry, KernelBase, load
from convmatrix.matrix import Case, builtin_names, coverage, expand_matrix, load_matrix

SPEC_ROWS = (
    "width K",
    "length L",
    "channels C",
    "batch B",
    "layout",
    "activation",
    "parameters",
    "state",
    "packed",
    "update",
)


@pytest.fixture(scope="module")
def nightly():
    return expand_matrix(load_matrix("nightly"))


def test_builtins_are_shipped():
    assert {"smoke", "nightly", "dao-parity"} <= set(builtin_names())


@pytest.mark.parametrize("kernel", [None, "torch", "reference"])
def test_nightly_covers_every_value_and_pair(kernel):
    expansion = expand_matrix(load_matrix("nightly"), load(kernel) if kernel else None)
    cov = coverage(expansion)
    assert [(i.row, i.value) for i in cov.spec if not i.covered] == []
    assert all(i.applicable for i in cov.spec)  # geometry defaults make every row checkable
    assert [p for p in cov.pairs if not p.complete] == []
    assert [v for v in cov.values if not v.covered] == []
    assert {"fwd_bwd", "fwd", "update"} <= {c.op for c in expansion.cases}
    assert any(c.expect == "error" for c in expansion.cases)


def test_nightly_stays_small_enough_for_a_cpu(nightly):
    # modest sizes: C <= 2*ctile+1, L <= a few tiles (SPEC: runnable on 2 CPU cores)
    assert len(nightly.cases) < 400
    assert max(c.dim for c in nightly.cases) <= 2 * nightly.geometry["ctile"] + 1
    assert max(c.seqlen or 0 for c in nightly.cases) <= 4 * nightly.geometry["tile"]


def test_smoke_is_small_and_touches_every_dimension():
    expansion = expand_matrix(load_matrix("smoke"), load("torch"))
    assert len(expansion.cases) <= 60
    covered_rows = {i.row for i in coverage(expansion).spec if i.cases}
    assert set(SPEC_ROWS) <= covered_rows


def test_dao_parity_has_upstream_counts():
    """Counts recomputed from upstream's parametrize lists and its skip rule."""
    counts = expand_matrix(load_matrix("dao-parity")).counts
    fwd = 0
    for channel_last, init, final in itertools.product((0, 1), (0, 1), (0, 1)):
        if channel_last or not (init or final):  # upstream: pytest.skip otherwise
            fwd += 2 * 18 * 3 * 2 * 2 * 3  # dim, seqlen, width, bias, silu, itype
    assert counts["test_causal_conv1d"] == fwd
    update = 3 * 3 * 3 * 2 * 2 * 2 * 3  # dim, width, seqlen, cache_seqlens, bias, silu, itype
    assert counts["test_causal_conv1d_update"] == update
    assert counts["test_causal_conv1d_update_with_batch_gather"] == update
    assert counts["test_causal_conv1d_update_with_padding"] == update // 2
    assert counts["test_causal_conv1d_varlen"] == 2 * 19 * 3 * 2 * 2 * 3
    assert counts["test_causal_conv1d_varlen_padding"] == 2 * 4 * 3 * 2 * 2 * 3


@pytest.mark.parametrize("name", ["smoke", "nightly", "dao-parity"])
def test_ids_are_unique_and_recomputable(name):
    cases = expand_matrix(load_matrix(name)).cases
    assert len({c.id for c in cases}) == len(cases)
    assert len({c.pytest_id for c in cases}) == len(cases)
    for case in cases[:1000]:
        if case.expect_reason is None:  # the id is the hash of the canonical parameters
            blob = json.dumps(case.canonical(), sort_keys=True, separators=(",", ":"))
            assert case.id == hashlib.sha256(blob.encode()).hexdigest()[:12]
        else:  # classified as an expected error: keeps the id of the plain case
            plain = dataclasses.replace(case, expect="ok", expect_reason=None, id="")
            assert case.id == plain.id
        assert Case.from_json(case.to_json()).id == case.id
        assert case.pytest_id.endswith(case.id[:6])


def test_id_of_a_fixed_case_never_changes():
    """A stability contract: diff matches cases of two commits by this id."""
    case = Case(
        suite="fwd_bwd",
        op="fwd_bwd",
        width=4,
        dim=40,
        batch=2,
        seqlen=65,
        layout="channel_last",
        activation="silu",
        bias=True,
        x_dtype="bfloat16",
        w_dtype="float32",
        initial_state="random",
        final_state=False,
    )
    assert case.id == "702362b5bc0a"
    assert case.pytest_id == "fwd_bwd-K4-L65-C40-B2-chlast-silu-bias-bf16w32-init-702362"


_IDS_SCRIPT = (
    "from convmatrix.matrix import expand_matrix, load_matrix\n"
    "for name in ('nightly', 'smoke'):\n"
    "    print(name, ' '.join(c.id for c in expand_matrix(load_matrix(name)).cases))\n"
)


def test_expansion_is_identical_across_processes():
    outputs = []
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [sys.executable, "-c", _IDS_SCRIPT],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=True,
        )
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    local = " ".join(c.id for c in expand_matrix(load_matrix("nightly")).cases)
    assert outputs[0].splitlines()[0] == f"nightly {local}"


class _Fp32WeightsOnly(KernelBase):
    """A kernel whose contract is Dao-like: widths 2-4, fp32 weights; nightly's geometry."""

    name = "fp32w"
    capabilities = Capabilities(
        widths=frozenset({2, 3, 4}),
        dtype_pairs=frozenset((x, "float32") for x in ("float32", "float16", "bfloat16")),
        features=frozenset({"backward", "initial_state", "final_state", "update"}),
        geometry=Geometry(time_tile=64, channel_tile=32, vector_width=8),
    )


def test_kernel_contract_makes_expected_errors_with_the_plain_id(nightly):
    classified = expand_matrix(load_matrix("nightly"), _Fp32WeightsOnly())
    assert [c.id for c in classified.cases] == [c.id for c in nightly.cases]
    changed = 0
    for plain, case in zip(nightly.cases, classified.cases, strict=True):
        rejected = case.width not in (2, 3, 4) or case.w_dtype != "float32"
        if plain.expect == "error":  # the matrix's own expected errors stay as written
            assert case == plain and case.expect_reason == plain.expect_reason
        elif rejected:
            changed += 1
            assert case.expect == "error" and case.expect_reason
            assert dataclasses.replace(case, expect="ok", expect_reason=None) == plain
        else:
            assert case == plain and case.expect == "ok"
    assert changed > 0
    # missing features (packed, ring buffer, slots) are not errors: runners skip those cases
    assert any(_Fp32WeightsOnly.capabilities.missing_features(c) for c in classified.cases)


def _readme_section() -> str:
    text = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    start = text.index("## Matrices")
    return text[start : text.index("\n## ", start + 1)]


def test_readme_example_matrix_expands(tmp_path):
    section = _readme_section()
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.yaml"
    path.write_text(example, encoding="utf-8")
    expansion = expand_matrix(load_matrix(str(path)))
    assert expansion.cases and not [p for p in coverage(expansion).pairs if not p.complete]


@pytest.mark.parametrize("name", ["smoke", "nightly", "dao-parity"])
def test_readme_states_the_case_counts(name):
    row = next(line for line in _readme_section().splitlines() if line.startswith(f"| `{name}`"))
    stated = int(row.split("|")[2])
    assert stated == len(expand_matrix(load_matrix(name)).cases)
