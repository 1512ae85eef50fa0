"""The device layer on this machine (CPU only) and the per-worker pinning rules."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from convmatrix.cli import main
from convmatrix.core import devices
from convmatrix.core.errors import UsageError
from convmatrix.runners.case.memory import PeakMemory


def test_cpu_is_always_available_and_accelerators_say_why_not():
    found = {b.kind: b for b in devices.discover_all()}
    assert list(found) == ["cpu", "cuda", "mlu"]
    assert found["cpu"].available and found["cpu"].count == 1
    for kind in ("cuda", "mlu"):
        backend = found[kind]
        if not backend.available:
            assert backend.reason and backend.count == 0
        assert backend.visible_env == devices.VISIBLE_ENV[kind]


def test_auto_resolves_to_a_usable_device():
    device = devices.resolve_device("auto")
    assert device.type in devices.KINDS
    assert devices.discover(device.type).available


def test_a_cuda_build_without_a_gpu_is_not_a_usable_accelerator(monkeypatch):
    # torch.accelerator.current_accelerator() answers from the build: a CUDA wheel on a
    # GPU-less host still says "cuda". Discovery must look at is_available() as well.
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert devices.accelerator() == ("cuda", False)


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "tpu:0"])
def test_bad_device_specs_are_usage_errors(spec):
    with pytest.raises(UsageError, match="--device"):
        devices.resolve_device(spec)


def test_unusable_device_is_a_usage_error_naming_the_reason():
    for kind in ("cuda", "mlu"):
        backend = devices.discover(kind)
        if backend.available:
            continue
        with pytest.raises(UsageError, match=kind):
            devices.resolve_device(kind)


def test_visible_devices_env_maps_worker_index_through_the_parent_restriction():
    assert devices.visible_devices_env("cpu", 3) == {}
    assert devices.visible_devices_env("cuda", 2, {}) == {"CUDA_VISIBLE_DEVICES": "2"}
    parent = {"MLU_VISIBLE_DEVICES": "4, 6,7"}
    assert devices.visible_devices_env("mlu", 1, parent) == {"MLU_VISIBLE_DEVICES": "6"}
    with pytest.raises(UsageError, match="index 3 is outside"):
        devices.visible_devices_env("mlu", 3, parent)
    with pytest.raises(UsageError, match="unknown device kind"):
        devices.visible_devices_env("tpu", 0, {})


def test_cpu_timer_and_synchronize():
    timer = devices.timer("cpu")
    timer.start()
    torch.ones(1000).sum()
    assert timer.stop() >= 0.0
    devices.synchronize("cpu")  # a no-op, must not raise


def test_peak_memory_on_the_cpu_counts_what_a_case_adds():
    # In a fresh process: in this one, memory freed by earlier tests may still be resident,
    # and a block placed there adds nothing to the high-water mark (correctly so).
    probe = (
        "import torch; from convmatrix.runners.case.memory import PeakMemory\n"
        "with PeakMemory(torch.device('cpu')) as m:\n"
        "    block = torch.ones(64 * 1024 * 1024 // 4); block += 1\n"
        "print(m.peak_mb)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    peak = float(done.stdout.strip())
    # Resident high-water mark minus the start: at least most of the 64 MiB just touched
    # (the allocator may reuse a little freed memory), not some unrelated process figure.
    assert 48 <= peak < 1024, done.stderr


def test_peak_memory_asks_the_devices_backend_for_any_accelerator():
    # One implementation for every kind: "mlu" goes to torch_mlu's torch.mlu like "cuda" goes
    # to torch.cuda (torch.device("mlu") itself needs torch_mlu, so the kind is given plainly).
    with pytest.raises(UsageError, match="torch_mlu"):
        PeakMemory(SimpleNamespace(type="mlu")).__enter__()


def test_devices_command_text_and_json(capsys):
    assert main(["devices"]) == 0
    text = capsys.readouterr().out
    assert "--device auto uses:" in text
    assert "CUDA_VISIBLE_DEVICES" in text and "MLU_VISIBLE_DEVICES" in text
    assert main(["devices", "--format", "json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert [b["kind"] for b in facts["backends"]] == ["cpu", "cuda", "mlu"]
    assert facts["auto"] == str(devices.resolve_device("auto"))


def test_the_memory_budget_holds_the_kernels_call_not_the_reference(tmp_path):
    # x is 16 MiB of float32 (B=1, C=64, L=65536). Measured here: the torch kernel's call adds
    # about 56 MB (a padded copy, the output, the bias added), the whole case about 156 MB
    # (the float64 reference and its bound magnitudes besides). A 100 MB budget sits between
    # them with room both ways: counted whole, this correct kernel fails (as a 4.3e7-element
    # case failed `tiled` at 8.5 GB in `convmatrix explore`).
    matrix = tmp_path / "big.matrix.yaml"
    matrix.write_text(
        "name: big\ngeometry: {tile: 64, ctile: 32, vec: 8}\ntimeout_s: 120\n"
        "memory_budget_mb: 100\nsuites:\n  fwd:\n    op: fwd\n    strategy: full\n"
        "    dimensions:\n      width: [4]\n      seqlen: [65536]\n      dim: [64]\n"
        "      batch: [1]\n      x_dtype: [float32]\n      w_dtype: [float32]\n"
    )
    argv = [sys.executable, "-m", "convmatrix", "run", "--matrix", str(matrix)]
    argv += ["--kernel", "torch", "-n", "0", "--no-db", "--device", "cpu"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
