"""The fla adapter over fla's real releases: one release per layout, found by its files, loaded
in a fresh process with the release on ``PYTHONPATH`` (as a checkout would be).

Releases come from ``CONVMATRIX_FLA_RELEASES`` (a directory of unpacked wheels named
``<dist>-<version>/``, e.g. ``fla_core-0.5.2/fla/...``), else ``pip download --no-deps`` into
the run's temporary root, shared by the xdist workers (under 1 MB each; pytest's cache plugin is
off in this project): the declared component ``fla-releases``.
Running releases from before 2026-07-25 needs a Triton with block pointers, a second Python
(``triton-block-ptr``, not in CI; benchmarks/real_history.py runs every release under it).

Numeric checks reuse test_tiled's judge (the (dtype, output) tolerance rows against the
float64 reference from the same rounded inputs).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from components import BLOCK_PTR_PYTHON_ENV, missing

from convmatrix.kernels.adapters.fla.cpu_bridges import SM_COUNT_ENV
from convmatrix.kernels.adapters.fla.layout import find_layout

REPO = Path(__file__).resolve().parents[1]
RELEASES_ENV = "CONVMATRIX_FLA_RELEASES"
# (PyPI distribution, version) -> the layout its files show
LAYOUTS = {
    ("flash-linear-attention", "0.2.1"): "convolution.py",  # no Triton conv in it
    ("flash-linear-attention", "0.3.0"): "convolution.py",  # a Triton conv without states
    ("flash-linear-attention", "0.3.1"): "convolution.py",
    ("fla-core", "0.5.2"): "conv/",
    ("fla-core", "0.6.0"): "causal_conv1d/",
}


@pytest.fixture(scope="session")
def releases(tmp_path_factory: pytest.TempPathFactory):
    """``tree(dist, version)``: the directory holding that release's ``fla/``.

    Downloads go to the parent of the worker's base temp (one per run, shared by the xdist
    workers, as xdist's docs do for once-per-run fixtures); each worker unpacks into its own
    directory and renames it into place, so two workers never see a half-written release."""
    given = os.environ.get(RELEASES_ENV)
    cache = Path(given) if given else tmp_path_factory.getbasetemp().parent / "fla-releases"

    def tree(dist: str, version: str) -> Path:
        where = cache / f"{dist.replace('-', '_')}-{version}"
        if (where / "fla").is_dir():
            return where
        if given:
            missing("fla-releases", f"{RELEASES_ENV}={given} has no {where.name}/fla")
        wheels = cache / f"wheels-{os.getpid()}"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary",
             ":all:", f"{dist}=={version}", "-d", str(wheels)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        found = sorted(wheels.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
        if done.returncode or not found:
            missing("fla-releases", f"pip download {dist}=={version}: {done.stderr[-300:]}")
        unpacked = cache / f"{where.name}.{os.getpid()}"
        with zipfile.ZipFile(found[0]) as wheel:
            wheel.extractall(unpacked)
        with contextlib.suppress(OSError):  # another worker put it in place first
            unpacked.rename(where)
        return where

    return tree


def in_release(tree: Path, code: str, python: str = sys.executable, **env: str) -> dict:
    """Run ``code`` (which prints one JSON line last) with ``tree`` first on PYTHONPATH."""
    path = os.pathsep.join([str(tree), str(REPO), str(REPO / "tests")])
    done = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": path, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.requires("fla-releases")
@pytest.mark.parametrize(("dist", "version"), list(LAYOUTS))
def test_layout_is_found_by_the_files_of_the_release(releases, dist, version):
    """Layouts are told apart by files alone (no import, no version string): fla-core
    0.4.2-0.5.2 also ship convolution.py (a shim over conv/), so newest is tried first."""
    tree = releases(dist, version)
    assert find_layout([tree / "fla"]).name == LAYOUTS[dist, version]
    assert find_layout([tree]) is None  # the package directory, not the tree, is the root


DESCRIBE = """
import json
from convmatrix.kernels import load
from convmatrix.kernels.adapters import triton_probes
kernel = load("fla")
reason = kernel.availability()
facts = dict(kernel.describe())
print(json.dumps({"reason": reason, "describe": facts, "no_block_ptr":
                  triton_probes.no_block_ptr() if facts.get("interpreter") else None}, default=str))
"""


@pytest.mark.requires("fla-releases", "triton")
@pytest.mark.parametrize(("dist", "version"), list(LAYOUTS))
def test_each_release_loads_or_says_why(releases, dist, version):
    """What loaded is recorded (layout, modules, the tree's version and path, the time tile);
    a release whose kernels use tl.make_block_ptr is refused exactly when this Triton's probe
    says it cannot run block pointers, and one without a Triton conv says so."""
    tree = releases(dist, version)
    got = in_release(tree, DESCRIBE)
    facts, reason = got["describe"], got["reason"]
    assert facts["layout"] == LAYOUTS[dist, version]
    assert facts["fla_version"] == version and facts["fla_path"] == str(tree / "fla")
    if version == "0.2.1":
        assert "has no Triton causal_conv1d" in reason
        return
    uses_block_ptr = version in ("0.3.0", "0.3.1")  # read in their convolution.py
    assert (reason is not None) == (uses_block_ptr and bool(got["no_block_ptr"])), reason
    if reason:
        assert "make_block_ptr" in reason and "docs/peers.md" in reason
        return
    assert facts["time_tile"]["tile"] == 64
    assert any(m.startswith("fla.modules") for m in facts["modules"])


ROUND_TRIP = """
import json, sys
from test_tiled import _seq_idx, limits, make_problem, relative_errors, run_both
from convmatrix.kernels.adapters.fla import FlaKernel
kernel = FlaKernel()
assert kernel.availability() is None, kernel.availability()
failing = {}
for lens in json.loads(sys.argv[1]):
    p = make_problem(2, 20, 70, 4, seed=5)
    seq_idx = None if lens is None else _seq_idx(2, lens)
    got, ref = run_both(kernel, p, layout="channel_last", seq_idx=seq_idx)
    bad = [k for k in ref if relative_errors(got[k], ref[k])[0] > limits("float32", k)[0]]
    failing[str(lens)] = bad
print(json.dumps({"failing": failing, "describe": dict(kernel.describe())}, default=str))
"""


def round_trip(tree: Path, lens: list) -> dict:
    """{str(lens): failing outputs} of forward+backward with a state, a final state (dF) and
    SiLU, B=2, C=20, L=70, fp32, against the float64 reference (test_tiled's rows)."""
    return in_release(tree, ROUND_TRIP.replace("sys.argv[1]", repr(json.dumps(lens))))


@pytest.mark.requires("fla-releases", "triton")
def test_conv_layout_release_matches_the_reference(releases):
    """fla-core 0.5.2 (conv/, no block pointers left) runs under the newest Triton: packed
    forward and backward with state, final state and padding against the reference."""
    got = round_trip(releases("fla-core", "0.5.2"), [[30, -3, 37], [30, 40]])
    assert got["failing"] == {"[30, -3, 37]": [], "[30, 40]": []}
    assert got["describe"]["layout"] == "conv/" and got["describe"]["fla_version"] == "0.5.2"


@pytest.mark.requires("fla-releases", "triton")
@pytest.mark.parametrize(("version", "failing"), [("0.5.2", ["dS"]), ("0.6.0", [])])
def test_a_release_with_a_known_bug_fails_exactly_its_output(releases, version, failing):
    """fla #1138/#1139 (fixed 2026-08-17, after 0.5.2): compute_dh0_kernel addressed dy with
    y's strides, so a backward with an initial state and a dy that is not (B, T, D)-dense
    gets a wrong d initial_state and right dx, dw, db. The adapter hands fla y's transpose,
    so dy arrives with strides (C*L, 1, L): 0.5.2 fails dS alone, 0.6.0 nothing."""
    got = round_trip(releases("fla-core", version), [None])
    assert got["failing"] == {"None": failing}


BRIDGES = """
import json, os
os.environ["TRITON_INTERPRET"] = "1"
from convmatrix.kernels.adapters.fla import cpu_bridges
from convmatrix.kernels.adapters.fla.cpu_bridges import SM_COUNT_ENV
from convmatrix.kernels.adapters.fla.layout import find_layout, fla_roots, import_conv
roots = fla_roots()
modules = import_conv(find_layout(roots), roots)
facts = cpu_bridges.install(modules)
print(json.dumps({"facts": facts, "sm": modules[0].get_multiprocessor_count(0)}))
"""


@pytest.mark.requires("fla-releases", "triton")
@pytest.mark.parametrize("forced", [None, "132"])
def test_old_fla_gets_an_sm_count_and_a_device_context_on_a_cpu(releases, forced):
    """flash-linear-attention 0.3.1 asks Triton's driver for the SM count (none under the
    interpreter: it raises) and enters torch.cpu.device (which does not exist): both bridged,
    and what was used recorded; CONVMATRIX_FLA_SM_COUNT chooses the count."""
    env = {SM_COUNT_ENV: forced} if forced else {}
    got = in_release(releases("flash-linear-attention", "0.3.1"), BRIDGES, **env)
    sm, device = got["facts"]["sm_count"], got["facts"]["device_context"]
    assert got["sm"] == sm["sm_count"] == (int(forced) if forced else 1)
    assert sm["bridged"] == ("CONVMATRIX_FLA_SM_COUNT is set" if forced else sm["bridged"])
    assert forced or "active drivers" in sm["bridged"]
    assert "torch.cpu" in device["bridged"] and device["with"] == "nullcontext for CPU tensors"


# -- releases that need a Triton with block pointers (a second Python, not in CI) ------------

TILES = """
import json
from test_tiled import _seq_idx, _stored_dtypes, assert_matches, make_problem, run_both
from convmatrix.kernels.adapters.fla import FlaKernel
kernel = FlaKernel()
assert kernel.availability() is None, kernel.availability()  # sets TRITON_INTERPRET first
from triton.runtime.interpreter import GridExecutor  # runs every launch, Triton 3.3 to 3.9
tiles, launch = [], GridExecutor.__call__

def recording(self, *args, **kwargs):  # the BT each forward launch really gets
    if self.fn.__name__ == "causal_conv1d_fwd_kernel":
        tiles.append(kwargs["BT"])
    return launch(self, *args, **kwargs)

GridExecutor.__call__ = recording
for batch, length, lens in ((2, 70, None), (2, 70, (30, -3, 37)), (1, 5, None)):
    p = make_problem(batch, 20, length, 4, seed=length)
    got, ref = run_both(kernel, p, seq_idx=None if lens is None else _seq_idx(batch, lens))
    assert_matches(got, ref, _stored_dtypes("float32", "float32"))
print(json.dumps({"tiles": tiles, "describe": dict(kernel.describe())}, default=str))
"""


@pytest.mark.requires("fla-releases", "triton-block-ptr")
def test_old_fla_runs_with_the_tile_it_declares(releases):
    """flash-linear-attention 0.3.1 (states, BT from the SM count) matches the reference, and
    with the bridged SM count the forward's launches take BT = 64 when B*T >= 64 (one tile
    of at least T tokens otherwise: 16 for B*T = 5), as the declared time tile says."""
    got = in_release(
        releases("flash-linear-attention", "0.3.1"), TILES, os.environ[BLOCK_PTR_PYTHON_ENV]
    )
    # B*T = 140, 140 (packed: one sequence of 140 tokens), 5; each twice: the backward
    # recomputes the forward (the pre-activation, for SiLU)
    assert got["tiles"] == [64, 64, 64, 64, 16, 16]
    assert got["describe"]["time_tile"]["tile"] == 64
    assert got["describe"]["cpu_bridges"]["sm_count"]["sm_count"] == 1


STATELESS = """
import json, torch
from test_tiled import make_problem, _seq_idx, assert_matches
from convmatrix.kernels.adapters.fla import FlaKernel
from convmatrix.kernels.oracle.reference import reference_forward
kernel = FlaKernel()
assert kernel.availability() is None, kernel.availability()
caps = kernel.capabilities
p = make_problem(2, 20, 70, 4, seed=9)
for seq_idx in (None, _seq_idx(2, (30, 40))):
    outs = []
    for fn, cast in ((kernel.forward, torch.float32), (reference_forward, torch.float64)):
        leaves = [p[k].detach().to(cast).clone().requires_grad_(True) for k in ("x", "w", "b")]
        y = fn(*leaves, seq_idx=seq_idx, activation="silu")
        (y * p["g"].to(cast)).sum().backward()
        outs.append({"y": y, "dx": leaves[0].grad, "dw": leaves[1].grad, "db": leaves[2].grad})
    assert_matches(*outs, {k: "float32" for k in outs[1]})
print(json.dumps({"features": sorted(caps.features), "tokens": caps.max_update_tokens,
                  "final": caps.final_state}))
"""


@pytest.mark.requires("fla-releases", "triton-block-ptr")
def test_fla_without_state_arguments_declares_no_states(releases):
    """flash-linear-attention 0.3.0's causal_conv1d takes no initial/final state: neither is
    declared (cases with them are skipped, not failed), an update takes one token, and the
    stateless forward and backward match the reference."""
    got = in_release(
        releases("flash-linear-attention", "0.3.0"), STATELESS, os.environ[BLOCK_PTR_PYTHON_ENV]
    )
    assert got == {"features": ["backward", "packed", "update"], "tokens": 1, "final": "none"}


# -- benchmarks/real_history.py: the trees in release order, one commit each ---------------


def _real_history():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "real_history", REPO / "benchmarks" / "real_history.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_history_repository_has_one_commit_per_release_in_release_order(tmp_path):
    """Releases are ordered by their wheel's date, not by name (0.10 after 0.9), meta-packages
    without fla/modules are left out, and each release becomes one commit of its fla/ tree,
    tagged and dated, so that convmatrix bisect walks them in order."""
    history = _real_history()
    dates = {"fla_core-0.10.0": 300, "fla_core-0.9.0": 200, "flash_linear_attention-0.9.1": 250}
    for name, day in dates.items():
        tree = tmp_path / "x" / name
        meta = tree / f"{name}.dist-info" / "METADATA"
        meta.parent.mkdir(parents=True)
        meta.write_text("Name: x\n")
        if name.startswith("fla_core"):  # the other is a meta-package: layers only
            (tree / "fla" / "modules").mkdir(parents=True)
            (tree / "fla" / "modules" / "convolution.py").write_text(f"# {name}\n")
        os.utime(meta, (day * 86400, day * 86400))
    trees = history.release_trees(tmp_path / "x", None)
    assert [t.label for t in trees] == ["0.9.0", "0.10.0"]
    assert [t.date for t in trees] == ["1970-07-20", "1970-10-28"]
    shas = history.build_repo(trees, tmp_path / "repo")
    log = subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "log", "--format=%H %cs %s", "--reverse"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert [line.split()[0] for line in log] == [shas["0.9.0"], shas["0.10.0"]]
    assert [line.split()[1] for line in log] == ["1970-07-20", "1970-10-28"]
    tagged = subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "rev-parse", "fla-0.9.0"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert tagged == shas["0.9.0"]
