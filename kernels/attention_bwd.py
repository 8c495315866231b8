"""Causal attention backward, flash-style, with grouped-query attention.

Given q [B, H, T, D], k/v [B, Hkv, T, D], the forward's o [B, H, T, D] and lse
[B, H, T, 1] (float32, of the scaled scores) and do = dL/do, computes dq, dk, dv without
storing the attention matrix. Each query tile i (128 rows) walks its keys up to the
diagonal in blocks of 512 (one PSUM bank of float32 scores, one matmul each for S and
dP), recomputing

    P  = exp(scale * Q_i K^T - lse_i)            (masked above the diagonal)
    dP = dO_i V^T
    dS = scale * P * (dP - D_i),  D_i = rowsum(dO_i * O_i)

and then, per 128-key sub-tile j of the block,

    dV_j += P^T dO_i,  dK_j += dS^T Q_i          (P, dS as stored: queries on partitions)
    dQ_i += dS K_j                               (dS transposed on the Tensor Engine)

dQ_i accumulates in one PSUM tile across every sub-tile of every block and is stored
once per query tile; dK and dV accumulate in float32 SBUF.

Work items are (batch row, KV head): the group's query heads all feed the same dK/dV,
so one item owns them and they are written once; the LNC grid's programs split the
items. Per item K^T, V^T and K rows stay in SBUF, per query head Q^T, dO^T, Q and dO
rows.
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128
KCHUNK = 512  # keys per block: one 2 KiB PSUM bank of float32 scores per partition


def _share(n_items):
    """(first, count): this program's contiguous share of n_items under the launch grid."""
    pid, nprog = nl.program_id(0), nl.num_programs(0)
    base, extra = n_items // nprog, n_items % nprog
    return pid * base + min(pid, extra), base + (1 if pid < extra else 0)


def _load(src, b, h, rows_out, cols_out):
    """src[b, h] ([T, D] in HBM) as rows [128, nt, D] and, transposed, cols [D, T]."""
    t, d = src.shape[2], src.shape[3]
    for i in nl.static_range(-(-t // PMAX)):
        r0 = i * PMAX
        rows = min(PMAX, t - r0)
        nisa.dma_copy(dst=rows_out[0:rows, i, :], src=src[b, h, r0 : r0 + rows, :])
        t_ps = nl.ndarray((d, PMAX), dtype=src.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=t_ps[:, 0:rows], data=rows_out[0:rows, i, :])
        nisa.tensor_copy(dst=cols_out[:, r0 : r0 + rows], src=t_ps[:, 0:rows])


def _row_stats(q, o, do, lse, b, h, dor, neg_lse, di):
    """neg_lse[:, i] = -lse of query tile i; di[:, i] = rowsum(dO * O) (float32)."""
    t, d = q.shape[2], q.shape[3]
    for i in nl.static_range(-(-t // PMAX)):
        q0 = i * PMAX
        rq = min(PMAX, t - q0)
        nisa.dma_copy(dst=neg_lse[0:rq, i : i + 1], src=lse[b, h, q0 : q0 + rq, :])
        nisa.tensor_scalar(
            dst=neg_lse[0:rq, i : i + 1],
            data=neg_lse[0:rq, i : i + 1],
            op0=nl.multiply,
            operand0=-1.0,
        )
        ot = nl.ndarray((PMAX, d), dtype=o.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ot[0:rq, :], src=o[b, h, q0 : q0 + rq, :])
        prod = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(
            dst=prod[0:rq, :], data1=ot[0:rq, :], data2=dor[0:rq, i, :], op=nl.multiply
        )
        nisa.tensor_reduce(
            dst=di[0:rq, i : i + 1], op=nl.add, data=prod[0:rq, :], axis=1, keepdims=True
        )


def _add_psum(acc, ps, rows, d):
    """acc[0:rows, :] += ps[0:rows, :] (float32 SBUF accumulator, PSUM product)."""
    nisa.tensor_tensor(dst=acc[0:rows, :], data1=acc[0:rows, :], data2=ps[0:rows, 0:d], op=nl.add)


def _chunk(kv, head, i, k0, kc, dq_ps, scale):
    """Query tile i against keys k0 .. k0 + kc (<= 512, one PSUM bank of scores).

    kv = (K rows, K^T, V^T, dK, dV, T) of the KV head; head = (Q rows, Q^T, dO rows,
    dO^T, -lse, D) of the query head. dQ_i accumulates in ``dq_ps`` (PSUM) over every
    128-key sub-tile of every chunk; dK_j and dV_j are added into SBUF per sub-tile."""
    kr, kT, vT, dk, dv, t = kv
    qr, qT, dor, doT, neg_lse, di = head
    d, dt = qr.shape[2], qr.dtype
    q0 = i * PMAX
    rq = min(PMAX, t - q0)
    s_ps = nl.ndarray((PMAX, KCHUNK), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps[0:rq, 0:kc], stationary=qT[:, q0 : q0 + rq], moving=kT[:, k0 : k0 + kc])
    p = nl.ndarray((PMAX, KCHUNK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(
        dst=p[0:rq, 0:kc],
        op=nl.exp,
        data=s_ps[0:rq, 0:kc],
        scale=scale,
        bias=neg_lse[0:rq, i : i + 1],
    )
    if k0 + kc > q0:  # keep key x of query row r where (q0 + r) - (k0 + x) >= 0
        nisa.affine_select(
            dst=p[0:rq, 0:kc],
            pattern=[[-1, kc]],
            channel_multiplier=1,
            on_true_tile=p[0:rq, 0:kc],
            on_false_value=0.0,
            cmp_op=nl.greater_equal,
            offset=q0 - k0,
        )
    p_lo = nl.ndarray((PMAX, KCHUNK), dtype=dt, buffer=nl.sbuf)  # on the idler Scalar Engine
    nisa.activation(dst=p_lo[0:rq, 0:kc], op=nl.copy, data=p[0:rq, 0:kc])
    dp_ps = nl.ndarray((PMAX, KCHUNK), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(
        dst=dp_ps[0:rq, 0:kc], stationary=doT[:, q0 : q0 + rq], moving=vT[:, k0 : k0 + kc]
    )
    ds = nl.ndarray((PMAX, KCHUNK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=ds[0:rq, 0:kc],
        data=dp_ps[0:rq, 0:kc],
        op0=nl.subtract,
        operand0=di[0:rq, i : i + 1],
        op1=nl.multiply,
        operand1=scale,
    )
    ds_lo = nl.ndarray((PMAX, KCHUNK), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=ds_lo[0:rq, 0:kc], data1=ds[0:rq, 0:kc], data2=p[0:rq, 0:kc], op=nl.multiply)
    for c in nl.static_range(0, kc, PMAX):
        kk = min(PMAX, kc - c)
        j = (k0 + c) // PMAX
        dv_ps = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=dv_ps[0:kk, :], stationary=p_lo[0:rq, c : c + kk], moving=dor[0:rq, i, :])
        _add_psum(dv[:, j, :], dv_ps, kk, d)
        dk_ps = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=dk_ps[0:kk, :], stationary=ds_lo[0:rq, c : c + kk], moving=qr[0:rq, i, :])
        _add_psum(dk[:, j, :], dk_ps, kk, d)
        dsT_ps = nl.ndarray((PMAX, PMAX), dtype=dt, buffer=nl.psum)
        nisa.nc_transpose(dst=dsT_ps[0:kk, 0:rq], data=ds_lo[0:rq, c : c + kk])
        dsT = nl.ndarray((PMAX, PMAX), dtype=dt, buffer=nl.sbuf)
        nisa.activation(dst=dsT[0:kk, 0:rq], op=nl.copy, data=dsT_ps[0:kk, 0:rq])
        nisa.nc_matmul(dst=dq_ps[0:rq, :], stationary=dsT[0:kk, 0:rq], moving=kr[0:kk, j, :])


def _query_tile(kv, head, i, dq, b, h, scale):
    """dQ of query tile i: every key chunk up to its diagonal, accumulated in one PSUM
    tile, then cast and stored."""
    t, d = kv[5], head[0].shape[2]
    q0 = i * PMAX
    rq = min(PMAX, t - q0)
    dq_ps = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.psum)
    for k0 in nl.static_range(0, q0 + rq, KCHUNK):
        _chunk(kv, head, i, k0, min(KCHUNK, q0 + rq - k0), dq_ps, scale)
    out = nl.ndarray((PMAX, d), dtype=dq.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out[0:rq, :], src=dq_ps[0:rq, :])
    nisa.dma_copy(dst=dq[b, h, q0 : q0 + rq, :], src=out[0:rq, :])


def _store(acc, dst, b, h, t, dtype):
    """Cast a float32 [128, nt, D] accumulator to dtype and write dst[b, h] ([T, D])."""
    d = dst.shape[3]
    for i in nl.static_range(-(-t // PMAX)):
        r0 = i * PMAX
        rows = min(PMAX, t - r0)
        out = nl.ndarray((PMAX, d), dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out[0:rows, :], src=acc[0:rows, i, :])
        nisa.dma_copy(dst=dst[b, h, r0 : r0 + rows, :], src=out[0:rows, :])


def _kv_head(q, k, v, o, do, lse, dq, dk, dv, b, kvh, scale):
    t, d = q.shape[2], q.shape[3]
    group = q.shape[1] // k.shape[1]
    nt = -(-t // PMAX)
    dt = q.dtype
    kr = nl.ndarray((PMAX, nt, d), dtype=dt, buffer=nl.sbuf)
    kT = nl.ndarray((d, nt * PMAX), dtype=dt, buffer=nl.sbuf)
    vr = nl.ndarray((PMAX, nt, d), dtype=dt, buffer=nl.sbuf)
    vT = nl.ndarray((d, nt * PMAX), dtype=dt, buffer=nl.sbuf)
    _load(k, b, kvh, kr, kT)
    _load(v, b, kvh, vr, vT)
    dk_acc = nl.ndarray((PMAX, nt, d), dtype=nl.float32, buffer=nl.sbuf)
    dv_acc = nl.ndarray((PMAX, nt, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=dk_acc, value=0.0)
    nisa.memset(dst=dv_acc, value=0.0)
    kv = (kr, kT, vT, dk_acc, dv_acc, t)
    for r in nl.static_range(group):
        h = kvh * group + r
        qr = nl.ndarray((PMAX, nt, d), dtype=dt, buffer=nl.sbuf)
        qT = nl.ndarray((d, nt * PMAX), dtype=dt, buffer=nl.sbuf)
        dor = nl.ndarray((PMAX, nt, d), dtype=dt, buffer=nl.sbuf)
        doT = nl.ndarray((d, nt * PMAX), dtype=dt, buffer=nl.sbuf)
        _load(q, b, h, qr, qT)
        _load(do, b, h, dor, doT)
        neg_lse = nl.ndarray((PMAX, nt), dtype=nl.float32, buffer=nl.sbuf)
        di = nl.ndarray((PMAX, nt), dtype=nl.float32, buffer=nl.sbuf)
        _row_stats(q, o, do, lse, b, h, dor, neg_lse, di)
        head = (qr, qT, dor, doT, neg_lse, di)
        for i in nl.static_range(nt):
            _query_tile(kv, head, i, dq, b, h, scale)
    _store(dk_acc, dk, b, kvh, t, dk.dtype)
    _store(dv_acc, dv, b, kvh, t, dv.dtype)


@nki.jit
def attention_bwd(q, k, v, o, do, lse, scale):
    """(dq [B, H, T, D], dk [B, Hkv, T, D], dv [B, Hkv, T, D]) in q's, k's, v's dtypes.

    q, do [B, H, T, D] and k, v [B, Hkv, T, D] share one dtype; o is the forward's output,
    lse [B, H, T, 1] its float32 log-sum-exp of the scaled scores."""
    bsz, heads, t, d = q.shape
    kv_heads = k.shape[1]
    dq = nl.ndarray((bsz, heads, t, d), dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((bsz, kv_heads, t, d), dtype=k.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((bsz, kv_heads, t, d), dtype=v.dtype, buffer=nl.shared_hbm)
    first, count = _share(bsz * kv_heads)
    for j in nl.affine_range(count):
        b = (first + j) // kv_heads
        kvh = (first + j) % kv_heads
        _kv_head(q, k, v, o, do, lse, dq, dk, dv, b, kvh, scale)
    return dq, dk, dv
