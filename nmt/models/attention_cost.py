"""What makes attention cost what the mechanism costs (nmt.models.attention uses these): additive and concat scores
v_a^T tanh(q_t + k_s) computed a block at a time, never holding the (B, T, S, A) tensor (`additive_scores`, its
backward recomputing the tanh), and a local window's scores and weighted sum over its W = 2D + 1 positions only,
without gathering all (B, T, W, K) rows at once (`window_dot`, `window_sum`). Each equals the dense computation
it replaces (tests/test_attention_cost.py: values and gradients against the dense masked reference, gradcheck).

Shape legend: B batch, T query steps, S source length, K key dim, A attention hidden size, W positions of a local
window, N = B * T query rows, M = B * S key rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

CHUNK = 2**20  # elements of one block of the tanh (B, T, S, A) or of gathered window rows held at once (4 MB in fp32)
KEEP = 2**22  # additive_scores over at most this many (B, T, S, A) elements: one block, its tanh kept for backward


def blocks(B: int, T: int, S: int, A: int, chunk: int) -> Iterator[tuple[slice, slice, slice]]:
    """Slices of batch, queries and keys whose blocks (B', T', S', A) hold at most `chunk` elements
    (one key row of A at least): S is split only if one query's keys alone pass it, B only if all T fit."""
    s_size = max(1, min(S, chunk // A))
    t_size = max(1, min(T, chunk // (s_size * A)))
    b_size = max(1, min(B, chunk // (t_size * s_size * A)))
    for b in range(0, B, b_size):
        for t in range(0, T, t_size):
            for s in range(0, S, s_size):
                yield slice(b, b + b_size), slice(t, t + t_size), slice(s, s + s_size)


def tanh_block(q: torch.Tensor, k: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """h = tanh(q_t + k_s) (B', T', S', A) for q (B', T', A), k (B', S', A), written into `buffer` (reused by
    every block: a fresh block of megabytes costs more in page faults than the sum itself)."""
    shape = (q.size(0), q.size(1), k.size(1), q.size(2))
    hidden = buffer[: shape[0] * shape[1] * shape[2] * shape[3]].view(shape)
    return torch.add(q[:, :, None, :], k[:, None, :, :], out=hidden).tanh_()


class AdditiveScores(torch.autograd.Function):
    """e_ts = v^T tanh(q_t + k_s) (B, T, S) block by block, never holding more than one block of (B, T, S, A).

    With h = tanh(q_t + k_s) and g = dL/de_ts:  dL/dq_t = v * sum_s g (1 - h^2),  dL/dk_s = v * sum_t g (1 - h^2),
    dL/dv = sum_ts g h. Backward recomputes each block's h from the saved q, k, v; when the whole (B, T, S, A)
    is one block (a decoder step's scores), the forward's h is kept for the backward instead.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int) -> torch.Tensor:
        ctx.save_for_backward(q, k, v)
        ctx.chunk, ctx.hidden = chunk, None
        (B, T, A), S = q.shape, k.size(1)
        scores = q.new_empty(B, T, S)
        buffer = q.new_empty(min(max(chunk, A), B * T * S * A))
        with torch.autocast(q.device.type, enabled=False):  # in the inputs' dtype
            for b, t, s in blocks(B, T, S, A, chunk):
                hidden = tanh_block(q[b, t], k[b, s], buffer)  # (B', T', S', A)
                scores[b, t, s] = hidden @ v  # (B', T', S')
                if hidden.numel() == B * T * S * A and any(ctx.needs_input_grad[:3]):
                    ctx.hidden = hidden  # one block: keep it rather than compute it again
        return scores

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v = ctx.saved_tensors
        (B, T, A), S = q.shape, k.size(1)
        if not grad.numel():  # no block (T or S is 0): no gradient
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None
        total = torch.promote_types(q.dtype, torch.float32)  # sums over blocks kept in fp32 at least
        # sum_s g (h^2 - 1) (B, T, A) and sum_t g (h^2 - 1) (B, S, A), written by the first block of their rows
        across_s, across_t = q.new_empty(B, T, A, dtype=total), k.new_empty(B, S, A, dtype=total)
        grad_v = v.new_zeros(A, dtype=total)  # sum_ts g h
        grad = grad.to(q.dtype)
        kept, ctx.hidden = ctx.hidden, None  # used once: a second backward recomputes it
        buffer = None if kept is not None else q.new_empty(min(max(ctx.chunk, A), B * T * S * A))
        with torch.autocast(q.device.type, enabled=False):
            for b, t, s in blocks(B, T, S, A, ctx.chunk):
                hidden = kept if kept is not None else tanh_block(q[b, t], k[b, s], buffer)  # (B', T', S', A)
                g = grad[b, t, s]  # (B', T', S')
                grad_v += (g.reshape(1, -1) @ hidden.reshape(-1, A))[0]
                pre = hidden.mul_(hidden).sub_(1)  # h^2 - 1
                rows, keys = pre.shape[0] * pre.shape[1], pre.shape[2]
                add_to(across_s, (b, t), torch.bmm(g.reshape(rows, 1, keys), pre.view(rows, keys, A)), s.start == 0)
                pre.mul_(g[..., None])
                add_to(across_t, (b, s), pre[:, 0] if pre.size(1) == 1 else pre.sum(1), t.start == 0)
        needs = ctx.needs_input_grad
        return (
            across_s.mul_(-v).to(q.dtype) if needs[0] else None,
            across_t.mul_(-v).to(k.dtype) if needs[1] else None,
            grad_v.to(v.dtype) if needs[2] else None,
            None,
        )


def add_to(total: torch.Tensor, index: tuple[slice, slice], part: torch.Tensor, first: bool) -> None:
    """total[index] += part, or = part on the first block of those rows (no zero fill beforehand)."""
    if first:
        total[index] = part.view(total[index].shape)
    else:
        total[index] += part.view(total[index].shape)


def additive_scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """v^T tanh(q_t + k_s) for q (B, T, A), k (B, S, A), v (A,) -> (B, T, S), without the (B, T, S, A) tensor
    (Bahdanau et al. 2014, eq. 6; Luong et al. 2015's concat). In q's and k's common dtype (bf16 under
    autocast), in blocks of at most `chunk` elements: by default one block up to KEEP (a decoder step's scores:
    the backward reuses its tanh, as autograd would), CHUNK beyond."""
    dtype, total = torch.promote_types(q.dtype, k.dtype), q.size(0) * q.size(1) * k.size(1) * q.size(2)
    chunk = chunk or (max(total, 1) if total <= KEEP else CHUNK)
    return AdditiveScores.apply(q.to(dtype), k.to(dtype), v.to(dtype), chunk)


def window_blocks(index: torch.Tensor, dim: int, like: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """Blocks of the query rows n of index (N, W) whose windows (N', W, dim) hold at most CHUNK elements (a row at
    least), each with a buffer (N' * W, dim) for them: the same memory every time, so no fresh megabytes to fault in."""
    N, W = index.shape
    size = max(1, CHUNK // max(1, W * dim))
    buffer = like.new_empty(min(N, size) * W, dim)
    for start in range(0, N, size):
        n = slice(start, start + size)
        yield n, buffer[: index[n].numel()]


def dot_windows(x: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x_n . table[index[n, w]] (N, W) for x (N, K), table (M, K), index (N, W)."""
    out = x.new_empty(index.shape)
    for n, buffer in window_blocks(index, x.size(1), x):
        rows = torch.index_select(table, 0, index[n].flatten(), out=buffer).view(-1, index.size(1), x.size(1))
        out[n] = torch.bmm(x[n, None, :], rows.transpose(1, 2))[:, 0]  # (N', 1, K) @ (N', K, W)
    return out


def sum_windows(a: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """sum_w a[n, w] table[index[n, w]] (N, K) for a (N, W), table (M, K), index (N, W)."""
    out = a.new_empty(a.size(0), table.size(1))
    for n, buffer in window_blocks(index, table.size(1), table):
        rows = torch.index_select(table, 0, index[n].flatten(), out=buffer).view(-1, index.size(1), table.size(1))
        out[n] = torch.bmm(a[n, None, :], rows)[:, 0]  # (N', 1, W) @ (N', W, K)
    return out


def scatter_windows(a: torch.Tensor, x: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """The table's gradient in both products: (size, K), row m the sum of a[n, w] x_n over index[n, w] = m."""
    out = x.new_zeros(size, x.size(1))
    for n, buffer in window_blocks(index, x.size(1), x):
        torch.mul(a[n, :, None], x[n, None, :], out=buffer.view(-1, index.size(1), x.size(1)))  # (N', W, K)
        out.index_add_(0, index[n].flatten(), buffer)
    return out


class WindowDot(torch.autograd.Function):
    """e[n, w] = x_n . y_index[n, w] (N, W): each query against its own W rows of the table, a block at a time;
    nothing of size (N, W, K) is kept. The gradients are the other product (sum) and scatter_windows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, table, index)
        with torch.autocast(x.device.type, enabled=False):
            return dot_windows(x, table, index)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, table, index = ctx.saved_tensors
        grad, needs = grad.to(x.dtype).contiguous(), ctx.needs_input_grad
        with torch.autocast(x.device.type, enabled=False):
            return (
                sum_windows(grad, table, index) if needs[0] else None,
                scatter_windows(grad, x, index, table.size(0)) if needs[1] else None,
                None,
            )


class WindowSum(torch.autograd.Function):
    """c_n = sum_w a[n, w] y_index[n, w] (N, K): the weighted sum over each query's own W rows of the table."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, table, index)
        with torch.autocast(a.device.type, enabled=False):
            return sum_windows(a, table, index)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, table, index = ctx.saved_tensors
        grad, needs = grad.to(a.dtype).contiguous(), ctx.needs_input_grad
        with torch.autocast(a.device.type, enabled=False):
            return (
                dot_windows(grad, table, index) if needs[0] else None,
                scatter_windows(a, grad, index, table.size(0)) if needs[1] else None,
                None,
            )


def flat_windows(source: torch.Tensor, length: int) -> torch.Tensor:
    """Positions source (B, T, W) in sentences of `length` -> rows (B * T, W) of the flattened (B * length, *)."""
    offsets = length * torch.arange(source.size(0), device=source.device)[:, None, None]
    return (source + offsets).flatten(0, 1)


def window_dot(query: torch.Tensor, table: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """q_t . y_s (B, T, W) for query (B, T, K), table (B, S, K) at each query's positions source (B, T, W), in
    their common dtype; past one block (CHUNK) of gathered rows, a block at a time (WindowDot)."""
    (B, S, K), dtype = table.shape, torch.promote_types(query.dtype, table.dtype)
    x, rows, index = query.reshape(-1, K).to(dtype), table.reshape(B * S, K).to(dtype), flat_windows(source, S)
    if index.numel() * K > CHUNK:
        return WindowDot.apply(x, rows, index).view(source.shape)
    with torch.autocast(x.device.type, enabled=False):  # one block: plain ops, which keep it for the backward
        return torch.bmm(x[:, None, :], gathered(rows, index).transpose(1, 2)).view(source.shape)


def window_sum(weights: torch.Tensor, values: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """sum_w a_t(w) v_s (B, T, H) for weights (B, T, W) over values (B, S, H) at positions source (B, T, W); past
    one block (CHUNK) of gathered rows, a block at a time (WindowSum)."""
    (B, S, H), dtype = values.shape, torch.promote_types(weights.dtype, values.dtype)
    a, rows = weights.reshape(-1, source.size(-1)).to(dtype), values.reshape(B * S, H).to(dtype)
    index = flat_windows(source, S)
    if index.numel() * H > CHUNK:
        return WindowSum.apply(a, rows, index).view(*source.shape[:2], H)
    with torch.autocast(a.device.type, enabled=False):
        return torch.bmm(a[:, None, :], gathered(rows, index)).view(*source.shape[:2], H)


def gathered(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table (M, K) at index (N, W) -> (N, W, K), whole rows copied (index_select)."""
    return table.index_select(0, index.flatten()).view(*index.shape, -1)
