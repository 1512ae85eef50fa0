"""The adapters over the in-project stand-ins of their libraries' APIs: kernels that run an
adapter's translation on a CPU (``--kernel convmatrix.kernels.doubles.standins:mlu_vllm``).

Here, beside the stand-ins, because an adapter imports no double (tests/test_roles.py): the
adapters take the library's entry points as an argument, and this module hands them
``mlu_standin``'s or ``vllm_standin``'s.
"""

from __future__ import annotations

from convmatrix.kernels.adapters.mlu_fla import MluFlaKernel
from convmatrix.kernels.adapters.mlu_vllm import MluVllmKernel
from convmatrix.kernels.adapters.vllm import VllmKernel, VllmOps
from convmatrix.kernels.doubles import vllm_standin
from convmatrix.kernels.doubles.mlu_standin import STANDIN_OPS

__all__ = ["mlu_fla", "mlu_vllm", "vllm"]


def mlu_vllm() -> MluVllmKernel:
    """The torch_mlu_ops vLLM-port adapter over the stand-in of the API (runs on CPU)."""
    return MluVllmKernel(STANDIN_OPS)


def mlu_fla() -> MluFlaKernel:
    """The torch_mlu_ops fla-port adapter over the stand-in of the API (runs on CPU)."""
    return MluFlaKernel(STANDIN_OPS)


def vllm() -> VllmKernel:
    """The vLLM adapter over the in-project stand-in of vLLM's API (runs on CPU)."""
    ops = VllmOps(vllm_standin.causal_conv1d_fn, vllm_standin.causal_conv1d_update, "standin")
    return VllmKernel(ops)
