"""Softcapped cross-entropy over the vocabulary, streamed in chunks, forward and backward.

    s = cap * tanh(z / cap)            (s = z when cap == 0)
    loss = logsumexp(s) - s[target]    (0 where target < 0: ignored positions)

Layout: logits z [N, V] in HBM, rows on partitions. The vocabulary is walked once, in
chunks of VCHUNK columns (4 KiB of bfloat16 per partition per DMA), so the softcapped
logits exist only one chunk at a time in SBUF and never reach HBM. With a softcap,
s < cap bounds every logit, so cap is a fixed shift: lse = cap + log(sum exp(s - cap))
with exp(s - cap) in (e^(-2 cap), 1], no running max and no rescaling;
exp(cap * tanh(z / cap) - cap) is one Scalar Engine instruction on the tanh (scale=cap,
bias=-cap). Without a softcap the forward keeps an online logsumexp (running max,
rescaled running sum). The backward recomputes s chunk by chunk from z and the saved lse:

    dz = dloss * (softmax(s) - onehot(target)) * (1 - (s / cap)^2)

Row groups: a program's full row tiles are taken GROUP at a time, and tile j of a group
of g tiles starting at row r holds rows r + p * g + j (partition p; a step slice of z).
The group's per-row values (targets, loss, lse, dloss) are then one [128, g] tile whose
flat order is the rows' own, so each moves in one DMA per group instead of 4 bytes per
tile. The ragged tail (N % 128 rows) is one more tile on the last program.

targets arrive as float32 [N, 1] (exact for vocabularies below 2^24) so the one-hot is a
compare of the column index with the target: a [128, VCHUNK] column index is built once
per program (iota) and each chunk compares (index + chunk start) with the target in one
instruction.
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128
VCHUNK = 2048
GROUP = 512  # row tiles per group: a [128, 512] float32 stats tile is 2 KiB a partition
NEG_BIG = -1.0e30  # a finite -inf: exp(NEG_BIG - m) underflows to exactly 0


def _share(n_items):
    """(first, count): this program's contiguous share of n_items under the launch grid."""
    pid, nprog = nl.program_id(0), nl.num_programs(0)
    base, extra = n_items // nprog, n_items % nprog
    return pid * base + min(pid, extra), base + (1 if pid < extra else 0)


def _last_program():
    """The program that takes the ragged tail tile (the only one without a grid)."""
    return nl.program_id(0) == nl.num_programs(0) - 1


def _column_index():
    """[128, VCHUNK] float32 holding 0 .. VCHUNK - 1 on every partition (once a program)."""
    idx = nl.ndarray((PMAX, VCHUNK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=idx, pattern=[[1, VCHUNK]], offset=0, channel_multiplier=0)
    return idx


def _rows(t, r0, step, rows, c0, cols):
    """Rows r0, r0 + step, ... (rows of them) of HBM tensor t, columns c0 .. c0 + cols."""
    return t[r0 : r0 + step * (rows - 1) + 1 : step, c0 : c0 + cols]


def _softcapped(z, r0, step, rows, c0, cols, cap):
    """Load one chunk of logits and return it softcapped, in float32."""
    zt = nl.ndarray((PMAX, VCHUNK), dtype=z.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=zt[0:rows, 0:cols], src=_rows(z, r0, step, rows, c0, cols))
    s = nl.ndarray((PMAX, VCHUNK), dtype=nl.float32, buffer=nl.sbuf)
    if cap > 0:
        nisa.activation(dst=s[0:rows, 0:cols], op=nl.tanh, data=zt[0:rows, 0:cols], scale=1.0 / cap)
        nisa.tensor_scalar(
            dst=s[0:rows, 0:cols], data=s[0:rows, 0:cols], op0=nl.multiply, operand0=cap
        )
    else:
        nisa.tensor_copy(dst=s[0:rows, 0:cols], src=zt[0:rows, 0:cols])
    return s


def _onehot(idx, tg, rows, c0, cols):
    """1.0 where column index == target, else 0.0 (float32): one compare per chunk."""
    hot = nl.ndarray((PMAX, VCHUNK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=hot[0:rows, 0:cols],
        data=idx[0:rows, 0:cols],
        op0=nl.add,
        operand0=c0 * 1.0,
        op1=nl.equal,
        operand1=tg,
    )
    return hot


def _add_picked(idx, tg, vals, picked, rows, c0, cols):
    """picked += vals[target column] where the target falls in columns c0 .. c0 + cols."""
    hot = _onehot(idx, tg, rows, c0, cols)
    nisa.tensor_tensor(
        dst=hot[0:rows, 0:cols],
        data1=hot[0:rows, 0:cols],
        data2=vals[0:rows, 0:cols],
        op=nl.multiply,
    )
    part = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(
        dst=part[0:rows, :], op=nl.add, data=hot[0:rows, 0:cols], axis=1, keepdims=True
    )
    nisa.tensor_tensor(dst=picked, data1=picked, data2=part[0:rows, :], op=nl.add)


def _fwd_tile(z, idx, tg, out_loss, out_lse, r0, step, rows, cap):
    """Online logsumexp (no softcap): lse and loss of one tile into [rows, 1] views."""
    v = z.shape[1]
    m = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    l_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    picked = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=m[0:rows, :], value=NEG_BIG)
    nisa.memset(dst=l_sum[0:rows, :], value=0.0)
    nisa.memset(dst=picked[0:rows, :], value=0.0)
    for c0 in nl.static_range(0, v, VCHUNK):  # loop-carried (m, l_sum): runs in order
        cols = min(VCHUNK, v - c0)
        s = _softcapped(z, r0, step, rows, c0, cols, cap)
        cmax = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(
            dst=cmax[0:rows, :], op=nl.maximum, data=s[0:rows, 0:cols], axis=1, keepdims=True
        )
        m_new = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(
            dst=m_new[0:rows, :], data1=m[0:rows, :], data2=cmax[0:rows, :], op=nl.maximum
        )
        neg = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(
            dst=neg[0:rows, :], data=m_new[0:rows, :], op0=nl.multiply, operand0=-1.0
        )
        p = nl.ndarray((PMAX, VCHUNK), dtype=nl.float32, buffer=nl.sbuf)
        csum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(
            dst=p[0:rows, 0:cols],
            op=nl.exp,
            data=s[0:rows, 0:cols],
            bias=neg[0:rows, :],
            reduce_op=nl.add,
            reduce_res=csum[0:rows, :],
        )
        alpha = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=alpha[0:rows, :], op=nl.exp, data=m[0:rows, :], bias=neg[0:rows, :])
        nisa.tensor_tensor(
            dst=l_sum[0:rows, :], data1=l_sum[0:rows, :], data2=alpha[0:rows, :], op=nl.multiply
        )
        nisa.tensor_tensor(
            dst=l_sum[0:rows, :], data1=l_sum[0:rows, :], data2=csum[0:rows, :], op=nl.add
        )
        nisa.tensor_copy(dst=m[0:rows, :], src=m_new[0:rows, :])
        _add_picked(idx, tg, s, picked[0:rows, :], rows, c0, cols)
    nisa.activation(dst=out_lse, op=nl.log, data=l_sum[0:rows, :])
    nisa.tensor_tensor(dst=out_lse, data1=out_lse, data2=m[0:rows, :], op=nl.add)
    _loss(tg, out_lse, picked[0:rows, :], out_loss, rows)


def _fwd_tile_capped(z, idx, tg, out_loss, out_lse, r0, step, rows, cap):
    """One pass, fixed shift cap: lse = cap + log(sum exp(cap * t - cap)), t = tanh(z / cap)."""
    v = z.shape[1]
    shift = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=shift[0:rows, :], value=-cap)
    l_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    picked = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=l_sum[0:rows, :], value=0.0)
    nisa.memset(dst=picked[0:rows, :], value=0.0)
    for c0 in nl.static_range(0, v, VCHUNK):  # sums carried from chunk to chunk
        cols = min(VCHUNK, v - c0)
        zt = nl.ndarray((PMAX, VCHUNK), dtype=z.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=zt[0:rows, 0:cols], src=_rows(z, r0, step, rows, c0, cols))
        t = nl.ndarray((PMAX, VCHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=t[0:rows, 0:cols], op=nl.tanh, data=zt[0:rows, 0:cols], scale=1.0 / cap)
        p = nl.ndarray((PMAX, VCHUNK), dtype=nl.float32, buffer=nl.sbuf)
        csum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(
            dst=p[0:rows, 0:cols],
            op=nl.exp,
            data=t[0:rows, 0:cols],
            scale=cap,
            bias=shift[0:rows, :],
            reduce_op=nl.add,
            reduce_res=csum[0:rows, :],
        )
        nisa.tensor_tensor(
            dst=l_sum[0:rows, :], data1=l_sum[0:rows, :], data2=csum[0:rows, :], op=nl.add
        )
        _add_picked(idx, tg, t, picked[0:rows, :], rows, c0, cols)
    nisa.activation(dst=out_lse, op=nl.log, data=l_sum[0:rows, :])
    nisa.tensor_scalar(dst=out_lse, data=out_lse, op0=nl.add, operand0=cap)
    nisa.tensor_scalar(dst=picked[0:rows, :], data=picked[0:rows, :], op0=nl.multiply, operand0=cap)
    _loss(tg, out_lse, picked[0:rows, :], out_loss, rows)


def _loss(tg, out_lse, picked, out_loss, rows):
    """loss = (lse - s[target]) where target >= 0, else 0."""
    valid = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=valid[0:rows, :], data=tg, op0=nl.greater_equal, operand0=0.0)
    nisa.tensor_tensor(dst=out_loss, data1=out_lse, data2=picked, op=nl.subtract)
    nisa.tensor_tensor(dst=out_loss, data1=out_loss, data2=valid[0:rows, :], op=nl.multiply)


def _fwd_rows(z, idx, tg, out_loss, out_lse, r0, step, rows, cap):
    if cap > 0:  # static: cap is a compile-time float
        _fwd_tile_capped(z, idx, tg, out_loss, out_lse, r0, step, rows, cap)
    else:
        _fwd_tile(z, idx, tg, out_loss, out_lse, r0, step, rows, cap)


def _fwd_group(z, targets, loss, lse, idx, g0, g, cap):
    """Row tiles g0 .. g0 + g (rows g0 * 128 + p * g + j): stats in and out by one DMA each."""
    r0, n_rows = g0 * PMAX, g * PMAX
    tg = nl.ndarray((PMAX, GROUP), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tg[:, 0:g], src=targets[r0 : r0 + n_rows, :])
    out_loss = nl.ndarray((PMAX, GROUP), dtype=nl.float32, buffer=nl.sbuf)
    out_lse = nl.ndarray((PMAX, GROUP), dtype=nl.float32, buffer=nl.sbuf)
    for j in nl.affine_range(g):
        stats = (tg[:, j : j + 1], out_loss[:, j : j + 1], out_lse[:, j : j + 1])
        _fwd_rows(z, idx, stats[0], stats[1], stats[2], r0 + j, g, PMAX, cap)
    nisa.dma_copy(dst=loss[r0 : r0 + n_rows, :], src=out_loss[:, 0:g])
    nisa.dma_copy(dst=lse[r0 : r0 + n_rows, :], src=out_lse[:, 0:g])


def _fwd_tail(z, targets, loss, lse, idx, r0, rows, cap):
    """The last N % 128 rows: one tile, rows on consecutive partitions."""
    tg = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tg[0:rows, :], src=targets[r0 : r0 + rows, :])
    out = nl.ndarray((PMAX, 2), dtype=nl.float32, buffer=nl.sbuf)
    _fwd_rows(z, idx, tg[0:rows, :], out[0:rows, 0:1], out[0:rows, 1:2], r0, 1, rows, cap)
    nisa.dma_copy(dst=loss[r0 : r0 + rows, :], src=out[0:rows, 0:1])
    nisa.dma_copy(dst=lse[r0 : r0 + rows, :], src=out[0:rows, 1:2])


@nki.jit
def cross_entropy_fwd(z, targets, cap):
    """z [N, V], targets [N, 1] float32 -> (loss [N, 1], lse [N, 1]), both float32."""
    n = z.shape[0]
    loss = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    lse = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    idx = _column_index()
    first, count = _share(n // PMAX)
    for g in nl.static_range(0, count, GROUP):
        _fwd_group(z, targets, loss, lse, idx, first + g, min(GROUP, count - g), cap)
    if n % PMAX and _last_program():
        _fwd_tail(z, targets, loss, lse, idx, n - n % PMAX, n % PMAX, cap)
    return loss, lse


def _bwd_tile(z, idx, tg, neg_lse, g, dz, r0, step, rows, cap):
    """dz for one tile; tg, neg_lse (-lse) and g (dloss * valid) are [rows, 1] views."""
    v = z.shape[1]
    for c0 in nl.static_range(0, v, VCHUNK):
        cols = min(VCHUNK, v - c0)
        zt = nl.ndarray((PMAX, VCHUNK), dtype=z.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=zt[0:rows, 0:cols], src=_rows(z, r0, step, rows, c0, cols))
        p = nl.ndarray((PMAX, VCHUNK), dtype=nl.float32, buffer=nl.sbuf)
        out = nl.ndarray((PMAX, VCHUNK), dtype=z.dtype, buffer=nl.sbuf)
        if cap > 0:
            # t = tanh(z / cap); softmax(s) = exp(cap * t - lse): the cap rides on the scale
            t = nl.ndarray((PMAX, VCHUNK), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(
                dst=t[0:rows, 0:cols], op=nl.tanh, data=zt[0:rows, 0:cols], scale=1.0 / cap
            )
            nisa.activation(
                dst=p[0:rows, 0:cols], op=nl.exp, data=t[0:rows, 0:cols], scale=cap, bias=neg_lse
            )
        else:
            nisa.activation(dst=p[0:rows, 0:cols], op=nl.exp, data=zt[0:rows, 0:cols], bias=neg_lse)
        hot = _onehot(idx, tg, rows, c0, cols)
        nisa.tensor_tensor(
            dst=p[0:rows, 0:cols],
            data1=p[0:rows, 0:cols],
            data2=hot[0:rows, 0:cols],
            op=nl.subtract,
        )
        if cap > 0:
            # d(cap tanh(z/cap))/dz = 1 - t^2; the last multiply writes z's dtype directly
            nisa.activation(dst=t[0:rows, 0:cols], op=nl.square, data=t[0:rows, 0:cols])
            nisa.tensor_scalar(
                dst=t[0:rows, 0:cols],
                data=t[0:rows, 0:cols],
                op0=nl.multiply,
                operand0=-1.0,
                op1=nl.add,
                operand1=1.0,
            )
            nisa.tensor_scalar(
                dst=p[0:rows, 0:cols], data=p[0:rows, 0:cols], op0=nl.multiply, operand0=g
            )
            nisa.tensor_tensor(
                dst=out[0:rows, 0:cols],
                data1=p[0:rows, 0:cols],
                data2=t[0:rows, 0:cols],
                op=nl.multiply,
            )
        else:
            nisa.tensor_scalar(
                dst=out[0:rows, 0:cols], data=p[0:rows, 0:cols], op0=nl.multiply, operand0=g
            )
        nisa.dma_copy(dst=_rows(dz, r0, step, rows, c0, cols), src=out[0:rows, 0:cols])


def _bwd_stats(targets, lse, dloss, r0, n_rows, width, cols):
    """(targets, -lse, dloss * valid) of rows r0 .. r0 + n_rows as [128 or fewer, cols] tiles."""
    parts = n_rows // cols
    tg = nl.ndarray((PMAX, width), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tg[0:parts, 0:cols], src=targets[r0 : r0 + n_rows, :])
    neg_lse = nl.ndarray((PMAX, width), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=neg_lse[0:parts, 0:cols], src=lse[r0 : r0 + n_rows, :])
    nisa.tensor_scalar(
        dst=neg_lse[0:parts, 0:cols], data=neg_lse[0:parts, 0:cols], op0=nl.multiply, operand0=-1.0
    )
    g = nl.ndarray((PMAX, width), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g[0:parts, 0:cols], src=dloss[r0 : r0 + n_rows, :])
    valid = nl.ndarray((PMAX, width), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=valid[0:parts, 0:cols], data=tg[0:parts, 0:cols], op0=nl.greater_equal, operand0=0.0
    )
    nisa.tensor_tensor(
        dst=g[0:parts, 0:cols],
        data1=g[0:parts, 0:cols],
        data2=valid[0:parts, 0:cols],
        op=nl.multiply,
    )
    return tg, neg_lse, g


@nki.jit
def cross_entropy_bwd(z, targets, lse, dloss, cap):
    """dz [N, V] (z's dtype) for the per-row losses, given dloss [N, 1] float32."""
    n, v = z.shape
    dz = nl.ndarray((n, v), dtype=z.dtype, buffer=nl.shared_hbm)
    idx = _column_index()
    first, count = _share(n // PMAX)
    for g0 in nl.static_range(0, count, GROUP):
        g = min(GROUP, count - g0)
        r0 = (first + g0) * PMAX
        tg, neg_lse, gl = _bwd_stats(targets, lse, dloss, r0, g * PMAX, GROUP, g)
        for j in nl.affine_range(g):
            _bwd_tile(
                z,
                idx,
                tg[:, j : j + 1],
                neg_lse[:, j : j + 1],
                gl[:, j : j + 1],
                dz,
                r0 + j,
                g,
                PMAX,
                cap,
            )
    if n % PMAX and _last_program():
        rows = n % PMAX
        r0 = n - rows
        tg, neg_lse, gl = _bwd_stats(targets, lse, dloss, r0, rows, 1, 1)
        _bwd_tile(
            z, idx, tg[0:rows, :], neg_lse[0:rows, :], gl[0:rows, :], dz, r0, 1, rows, cap
        )
    return dz
