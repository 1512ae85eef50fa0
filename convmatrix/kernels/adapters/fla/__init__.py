"""Adapter ``fla``: flash-linear-attention's Triton causal conv1d (PyPI ``fla-core``, or any
fla tree on ``PYTHONPATH``: a checkout, an unpacked release) as a canonical kernel, natively
on CUDA and on a CPU under the Triton interpreter.

Which fla, and where its conv is: ``layout`` (three layouts since 2025, found by the files
present); how it is loaded on a CPU: ``loading`` (interpreter, workarounds, one autotune
config) and ``cpu_bridges`` (SM count, device context); the kernel: ``kernel``.

fla's API (read in fla-core 0.6.0's ``causal_conv1d/ops.py``; the same calls in ``conv/`` and
``convolution.py`` since flash-linear-attention 0.3.1, which added the state arguments):

- ``causal_conv1d(x, weight, bias, residual, initial_state, output_final_state, activation,
  backend="triton", cu_seqlens=None, ...) -> (y, final_state)``: ``x`` ``(B, T, D)`` any
  strides (``(1, total, D)`` with ``cu_seqlens`` ``(N+1,)``), ``weight`` ``(D, W)``;
  autograd (``CausalConv1dFunction``) gives dx, dweight, dbias and d initial_state.
  ``initial_state`` / ``final_state`` are ``(N, D, W)``: **W** columns, the last W inputs of
  each sequence (column W-1 the newest). The forward kernel reads columns 1..W-1 only
  (column 0 is one token too old to reach any output); the backward ignores the gradient of
  final-state column 0. Time tile ``BT = chunk_size = 64`` (before fla-core 0.4.2: from the
  SM count, ``cpu_bridges``); channel tile ``BD`` autotuned from 16/32/64/128.
- ``causal_conv1d_update(x, cache, residual, weight, bias, activation) -> (y, cache)``: one
  token per sequence, ``x`` ``(N, D)``, ``cache`` ``(N, D, W)`` (made contiguous by fla's
  ``input_guard``), shifted left by one and the token written to column W-1, in place; ``y``
  from the shifted cache. fla's own layer (``ShortConvolution``) takes this path for one token
  and otherwise calls ``causal_conv1d`` with the cache as initial state and
  ``output_final_state=True``.

Translation of a canonical call (docs/spec.md §2):

- x ``(B, C, L)`` → ``x.transpose(1, 2)`` (a view, any strides); y comes back contiguous
  ``(B, L, C)`` and is viewed as ``(B, C, L)``;
- the canonical state ``(B, C, K-1)`` → ``(B, C, K)`` with a zero column 0; the canonical
  final state is columns 1..K-1 of fla's (gradients flow through both slices);
- packed rows (``seq_idx``) → ``(1, B*L, C)`` tokens, one fla sequence per run of equal ids
  (padding runs included), ``cu_seqlens`` at the run boundaries; the initial state goes to the
  first run of its row, the others start from zero (fla: no state = zero state); outputs of
  padding tokens (negative ids) are zeroed here, which also zeroes their gradients; the final
  state is that of the row's last run;
- decode with one token → fla's in-place update on the state itself; with several tokens →
  ``causal_conv1d`` with the state as initial state, its final state copied into the state
  (what ``ShortConvolution`` does); ``state_indices`` naming rows 0..B-1 in order → those
  rows of the pool, updated in place.

What fla cannot express, declared in its ``Capabilities`` (docs/contract.md) so the matrix
files such cases as expected errors (and the calls raise ``ContractError``):

- a decode state of any length but W (``state_lens=STATE_LEN_K``: fla's cache is
  ``(N, D, W)``);
- a final state with packing when a row's last sequence is shorter than K-1 (and is not the
  whole row) (``final_state="per_sequence"``): fla's final state is per sequence and starts
  that sequence from zeros, while the canonical one is the row's last K-1 inputs across the
  boundary.

Missing features (cases skipped): ring-buffer states (``cache_seqlens``) and slot mapping
(``state_indices`` other than the identity).

flash-linear-attention 0.2.2-0.3.0 have no state arguments: neither state feature is declared
and an update takes one token (``kernel``).
"""

from convmatrix.kernels.adapters.fla.kernel import FlaKernel

__all__ = ["FlaKernel"]
