"""Adapters of real libraries behind the canonical protocol, each importing its library lazily
and reporting "unavailable: <reason>" where it cannot run: Dao's CUDA kernels (``dao``), fla's
Triton kernel (``fla``, with ``triton_interpreter`` for CPUs), vLLM's (``vllm``, through
``vllm_style``), and torch_mlu_ops' on Cambricon MLUs (``mlu_vllm``, ``mlu_fla``, ``mlu_ops``)."""
