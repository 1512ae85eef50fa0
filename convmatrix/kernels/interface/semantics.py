"""Argument contracts and state bookkeeping shared by every kernel written in this project.

docs/spec.md §2 fixes the semantics; this module holds the parts that are not arithmetic: checking
shapes and dtypes (raising ``ContractError``), the packed-sequence tap masks, and how a decode
update finds its history in, and writes new tokens to, a shifting or ring-buffer state.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from convmatrix.kernels.interface.protocol import ContractError

__all__ = [
    "ACTIVATIONS",
    "SILU",
    "check_forward_args",
    "check_update_args",
    "decode_prefix",
    "is_silu",
    "packed_tap_masks",
    "pool_rows",
    "update_via_forward",
    "write_decode_state",
]

# The spellings of SiLU in Dao's API: ``activation in ["silu", "swish"]``.
SILU = ("silu", "swish")
ACTIVATIONS = (None, *SILU)


def is_silu(activation: object) -> bool:
    """Whether a kernel call's ``activation`` asks for SiLU (every spelling the API takes)."""
    return activation in SILU


def check_forward_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    activation: str | None,
) -> tuple[int, int, int, int]:
    """Validate canonical forward arguments; return (B, C, L, K)."""
    if x.dim() != 3:
        raise ContractError(f"x must be (batch, dim, seqlen), got shape {tuple(x.shape)}")
    batch, dim, seqlen = x.shape
    if weight.dim() != 2 or weight.shape[0] != dim:
        raise ContractError(f"weight must be ({dim}, width), got shape {tuple(weight.shape)}")
    width = weight.shape[1]
    if width < 1:
        raise ContractError("weight width must be >= 1")
    if bias is not None and tuple(bias.shape) != (dim,):
        raise ContractError(f"bias must be ({dim},), got shape {tuple(bias.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (batch, dim, width - 1):
        raise ContractError(
            f"initial_state must be ({batch}, {dim}, {width - 1}), "
            f"got shape {tuple(initial_state.shape)}"
        )
    if seq_idx is not None:
        if tuple(seq_idx.shape) != (batch, seqlen):
            raise ContractError(
                f"seq_idx must be ({batch}, {seqlen}), got shape {tuple(seq_idx.shape)}"
            )
        if seq_idx.dtype.is_floating_point:
            raise ContractError(f"seq_idx must be an integer tensor, got {seq_idx.dtype}")
    if activation not in ACTIVATIONS:
        raise ContractError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return batch, dim, seqlen, width


def check_update_args(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    cache_seqlens: torch.Tensor | None,
    state_indices: torch.Tensor | None,
) -> tuple[int, int, int, int, int]:
    """Validate canonical update arguments; return (B, C, T, K, S)."""
    if x.dim() != 3:
        raise ContractError(f"x must be (batch, dim, tokens), got shape {tuple(x.shape)}")
    batch, dim, tokens = x.shape
    if conv_state.dim() != 3 or conv_state.shape[1] != dim:
        raise ContractError(
            f"conv_state must be (pool, {dim}, state_len), got {tuple(conv_state.shape)}"
        )
    width = check_forward_args(x, weight, bias, None, None, activation)[3]
    state_len = conv_state.shape[2]
    if state_len < width - 1:
        raise ContractError(f"state_len {state_len} < width-1 = {width - 1}")
    if state_indices is None and conv_state.shape[0] != batch:
        raise ContractError(
            f"conv_state has {conv_state.shape[0]} rows for batch {batch} without state_indices"
        )
    for name, t in (("cache_seqlens", cache_seqlens), ("state_indices", state_indices)):
        if t is not None and (tuple(t.shape) != (batch,) or t.dtype.is_floating_point):
            raise ContractError(f"{name} must be an integer tensor of shape ({batch},)")
    if state_indices is not None and bool((state_indices >= conv_state.shape[0]).any()):
        raise ContractError("state_indices names a row outside conv_state")
    return batch, dim, tokens, width, state_len


def final_state(x: torch.Tensor, state: torch.Tensor | None, width: int) -> torch.Tensor:
    """The last K-1 inputs of the state-padded row (``state`` ++ x, zeros for no state), a
    copy in x's dtype: the final state of a forward (docs/spec.md §2). Only x's tail is
    joined to the state: padding the whole row for it copies x (the torch path's chunks
    did, 0.7x a chunk's forward on bf16 channel-last C=3072)."""
    keep, length = width - 1, x.shape[-1]
    tail = x[..., length - min(keep, length) :]  # and the state's end, when L < K-1
    head = x.new_zeros(*x.shape[:-1], keep) if state is None else state.to(x.dtype)
    return torch.cat([head, tail], dim=-1)[..., tail.shape[-1] :]


def packed_tap_masks(seq_idx: torch.Tensor, width: int) -> torch.Tensor:
    """Boolean (K, B, L): may token t read tap k, i.e. token t-(K-1)+k?

    A tap is live when the tap's token belongs to the same sequence as token t and is not
    padding (negative id). Initial-state positions belong to the sequence of the row's first
    token. Outputs at padding tokens are zeroed by the caller.
    """
    batch, seqlen = seq_idx.shape
    first = seq_idx[:, :1].expand(batch, width - 1)
    ext = torch.cat([first, seq_idx], dim=1)  # (B, L+K-1)
    taps = [ext[:, k : k + seqlen] for k in range(width)]
    return torch.stack([(t == seq_idx) & (t >= 0) for t in taps])


def decode_prefix(
    state: torch.Tensor, width: int, cache_seqlens: torch.Tensor | None
) -> torch.Tensor:
    """The K-1 most recent tokens held by ``state`` (rows, C, S), oldest first: (rows, C, K-1).

    Shifting state: the last K-1 columns. Ring buffer: the newest token sits at
    ``(cache_seqlens - 1) % S`` and the j-th newest at ``(cache_seqlens - j) % S``.
    """
    rows, dim, state_len = state.shape
    if cache_seqlens is None:
        return state[:, :, state_len - (width - 1) :]
    offsets = torch.arange(-(width - 1), 0, device=state.device)
    cols = (cache_seqlens.to(state.device).long()[:, None] + offsets) % state_len  # (rows, K-1)
    return torch.gather(state, 2, cols[:, None, :].expand(rows, dim, width - 1))


def write_decode_state(
    state: torch.Tensor, x: torch.Tensor, cache_seqlens: torch.Tensor | None
) -> torch.Tensor:
    """The state after appending tokens ``x`` (rows, C, T) to ``state`` (rows, C, S).

    Shifting: ``cat(state, x)[..., -S:]``. Ring buffer: token t goes to column
    ``(cache_seqlens + t) % S``; with T > S later tokens overwrite earlier ones (last wins).
    Returns a new tensor; callers copy it into their pool rows.
    """
    state_len = state.shape[2]
    x = x.to(state.dtype)
    if cache_seqlens is None:
        return torch.cat([state, x], dim=2)[:, :, -state_len:]
    new = state.clone()
    start = cache_seqlens.to(state.device).long()
    rows = torch.arange(state.shape[0], device=state.device)
    for t in range(x.shape[2]):  # sequential writes: the last token to land on a column wins
        new[rows, :, (start + t) % state_len] = x[:, :, t]
    return new


def pool_rows(
    state_indices: torch.Tensor | None, batch: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch rows that run, pool rows they use); negative slot ids are padding and skip."""
    if state_indices is None:
        rows = torch.arange(batch, device=device)
        return rows, rows
    idx = state_indices.to(device).long()
    live = torch.nonzero(idx >= 0).flatten()
    return live, idx[live]


def update_via_forward(
    forward: Callable[..., torch.Tensor],
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    cache_seqlens: torch.Tensor | None,
    state_indices: torch.Tensor | None,
    read: Callable[..., torch.Tensor] = decode_prefix,
    write: Callable[..., torch.Tensor] = write_decode_state,
) -> torch.Tensor:
    """A decode update expressed as a forward over the new tokens with the history as state.

    ``forward(x, weight, bias, initial_state, activation) -> y`` is the kernel's own stateful
    forward. Only the pool rows named by live slots are read and written (in place); rows of
    padding slots output zeros. This is how the reference and the framework path update.
    """
    batch = check_update_args(
        x, conv_state, weight, bias, activation, cache_seqlens, state_indices
    )[0]
    width = weight.shape[1]
    live, pool = pool_rows(state_indices, batch, x.device)
    y = torch.zeros_like(x)
    if live.numel() == 0:
        return y
    state = conv_state.index_select(0, pool)
    seqlens = None if cache_seqlens is None else cache_seqlens.to(x.device)[live]
    prefix = read(state, width, seqlens).to(x.dtype)
    xl = x.index_select(0, live)
    y[live] = forward(xl, weight, bias, prefix, activation).to(y.dtype)
    conv_state.index_copy_(0, pool, write(state, xl, seqlens))
    return y
