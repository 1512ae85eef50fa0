"""Loading kernels by name and by ``module:attr``; the ``kernels`` and ``selfcheck`` commands."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from convmatrix.cli import main
from convmatrix.kernels import Kernel, KernelSpecError, load


@pytest.mark.parametrize("name", ["reference", "torch"])
def test_builtins_load_and_are_available(name):
    kernel = load(name)
    assert isinstance(kernel, Kernel)
    assert kernel.name == name
    assert kernel.availability() is None


def test_module_attr_spec_accepts_object_class_and_factory(tmp_path, monkeypatch):
    (tmp_path / "my_kernels.py").write_text(
        textwrap.dedent(
            """
            from convmatrix.kernels.builtin.framework import TorchKernel

            class Renamed(TorchKernel):
                name = "mine"

            instance = Renamed()

            def factory():
                return Renamed()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for attr in ("instance", "Renamed", "factory"):
        assert load(f"my_kernels:{attr}").name == "mine"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nonesuch", "unknown kernel 'nonesuch'"),
        ("no_such_module_xyz:k", "cannot import 'no_such_module_xyz'"),
        ("convmatrix.kernels:nothing_here", "has no attribute 'nothing_here'"),
        ("convmatrix.kernels.interface.protocol:Geometry", "is not a kernel"),
    ],
)
def test_bad_specs_say_what_was_tried(spec, message):
    with pytest.raises(KernelSpecError, match=message):
        load(spec)


def test_kernels_command_lists_builtins_available(capsys):
    assert main(["kernels"]) == 0
    lines = capsys.readouterr().out.splitlines()
    status = {line.split()[0]: line.split()[1] for line in lines}
    assert status["reference"] == "available"
    assert status["torch"] == "available"


def test_selfcheck_command_exits_zero_and_prints_each_check():
    proc = subprocess.run(
        [sys.executable, "-m", "convmatrix", "selfcheck"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    checks = [line for line in lines if line.startswith(("ok", "FAIL"))]
    assert len(checks) >= 7
    assert all("max|diff|" in line for line in checks)
    assert lines[-1] == f"{len(checks)} passed, 0 failed"


@pytest.mark.parametrize(
    "old, new",
    [
        ("convmatrix.kernels.mlu_vllm:standin", "convmatrix.kernels.doubles.standins:mlu_vllm"),
        ("convmatrix.kernels.mlu_fla:standin", "convmatrix.kernels.doubles.standins:mlu_fla"),
        ("convmatrix.kernels.adapters.vllm:standin", "convmatrix.kernels.doubles.standins:vllm"),
        ("convmatrix.kernels.tiled:make(T=32)", "convmatrix.kernels.builtin.tiled:make(T=32)"),
        ("convmatrix.kernels.framework:TorchKernel", "torch"),
    ],
)
def test_specs_naming_a_kernel_module_before_kernels_was_sorted_still_load(old, new):
    # Specs typed by people, stored with runs for --resume, or left in an older install's
    # entry points name the modules where they were before kernels/ got its subpackages.
    before, after = load(old), load(new)
    assert type(before) is type(after)
    assert before.name == after.name
