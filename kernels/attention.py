"""Causal attention, flash-style (online softmax), with grouped-query attention. Forward.

    o = softmax(scale * q k^T + causal mask) v,   q [B, H, T, D], k/v [B, Hkv, T, D]

Query head h reads key/value head h // (H / Hkv). D <= 128 (one matmul contraction).
Work items are (batch row, KV head), split across the LNC grid's programs. Per item,
K^T [D, T] is built once (128x128 Tensor Engine transposes) and V's row tiles are
loaded once; every query head of the group and every 128-row query tile reuses them.
A query tile walks its keys in chunks of 512 (one PSUM bank of float32 scores), up to
its last row's diagonal (chunks above it are skipped; only the chunk that reaches the
diagonal is masked), keeping a running row max m, running sum l and an unnormalised
accumulator in SBUF:

    S = Q K^T                          (Q^T [D, 128] stationary, K^T [D, 512] moving)
    m' = max(m, rowmax S);  P = exp(scale S - scale m');  l = l e^(scale (m - m')) + rowsum P
    acc = acc e^(m - m') + P V         (P transposed 128 keys at a time; the four P V
                                        products accumulate in one PSUM tile)

and finally o = acc / l, lse = scale m + log l (float32, [B, H, T, 1]) for the backward
kernel (attention_bwd.py). The scale is folded into the exp (its free input scale), so
scores below the diagonal are read straight from PSUM, never copied or rescaled.
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128
NEG_BIG = -1.0e30  # masked scores: finite so that exp(NEG_BIG - m) is exactly 0, never NaN
KCHUNK = 512  # keys per score tile: one 2 KiB PSUM bank of float32 per partition


def _share(n_items):
    """(first, count): this program's contiguous share of n_items under the launch grid."""
    pid, nprog = nl.program_id(0), nl.num_programs(0)
    base, extra = n_items // nprog, n_items % nprog
    return pid * base + min(pid, extra), base + (1 if pid < extra else 0)


def _load_transposed(src, dtype, rows, d):
    """[rows, d] from HBM -> [d, rows] in SBUF, via a Tensor Engine transpose."""
    t = nl.ndarray((PMAX, d), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:rows, :], src=src)
    t_ps = nl.ndarray((d, PMAX), dtype=dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=t_ps[:, 0:rows], data=t[0:rows, :])
    out = nl.ndarray((d, PMAX), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out[:, 0:rows], src=t_ps[:, 0:rows])
    return out


def _load_kv(k, v, b, kvh, kr, kT, vr):
    """K rows, K^T [D, T] (via Tensor Engine transposes) and V rows of one KV head."""
    t, d = k.shape[2], k.shape[3]
    for i in nl.static_range(-(-t // PMAX)):
        r0 = i * PMAX
        rows = min(PMAX, t - r0)
        nisa.dma_copy(dst=kr[0:rows, i, :], src=k[b, kvh, r0 : r0 + rows, :])
        nisa.dma_copy(dst=vr[0:rows, i, :], src=v[b, kvh, r0 : r0 + rows, :])
        t_ps = nl.ndarray((d, PMAX), dtype=k.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=t_ps[:, 0:rows], data=kr[0:rows, i, :])
        nisa.tensor_copy(dst=kT[:, r0 : r0 + rows], src=t_ps[:, 0:rows])


def _key_chunk(qT, kT, vr, state, q0, rq, k0, kc, scale):
    """Fold keys k0 .. k0 + kc into the running (m, l_sum, acc) of one query tile.

    m is kept in raw (unscaled) score units, so the scale rides on the exp's free input
    scale: P = exp(scale * S - scale * m). A chunk below the diagonal is read straight
    from PSUM; the one that reaches it is copied to SBUF for the mask (affine_select
    reads SBUF only). state = (m, l_sum, acc, neg): neg ends as -scale * m, which the
    lse reuses."""
    m, l_sum, acc, neg = state
    d = vr.shape[2]
    s_ps = nl.ndarray((PMAX, KCHUNK), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps[0:rq, 0:kc], stationary=qT[:, 0:rq], moving=kT[:, k0 : k0 + kc])
    scores = s_ps
    if k0 + kc > q0:
        # the chunk reaches the diagonal: keep key x of query row p where (q0 + p) - (k0 + x) >= 0
        s = nl.ndarray((PMAX, KCHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=s[0:rq, 0:kc], op=nl.copy, data=s_ps[0:rq, 0:kc])
        nisa.affine_select(
            dst=s[0:rq, 0:kc],
            pattern=[[-1, kc]],
            channel_multiplier=1,
            on_true_tile=s[0:rq, 0:kc],
            on_false_value=NEG_BIG,
            cmp_op=nl.greater_equal,
            offset=q0 - k0,
        )
        scores = s
    cmax = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(
        dst=cmax[0:rq, :], op=nl.maximum, data=scores[0:rq, 0:kc], axis=1, keepdims=True
    )
    m_new = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=m_new[0:rq, :], data1=m[0:rq, :], data2=cmax[0:rq, :], op=nl.maximum)
    nisa.tensor_scalar(dst=neg[0:rq, :], data=m_new[0:rq, :], op0=nl.multiply, operand0=-scale)
    p = nl.ndarray((PMAX, KCHUNK), dtype=vr.dtype, buffer=nl.sbuf)
    psum_row = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(
        dst=p[0:rq, 0:kc],
        op=nl.exp,
        data=scores[0:rq, 0:kc],
        scale=scale,
        bias=neg[0:rq, :],
        reduce_op=nl.add,
        reduce_res=psum_row[0:rq, :],
    )
    alpha = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(
        dst=alpha[0:rq, :], op=nl.exp, data=m[0:rq, :], scale=scale, bias=neg[0:rq, :]
    )
    nisa.tensor_tensor(
        dst=l_sum[0:rq, :], data1=l_sum[0:rq, :], data2=alpha[0:rq, :], op=nl.multiply
    )
    nisa.tensor_tensor(dst=l_sum[0:rq, :], data1=l_sum[0:rq, :], data2=psum_row[0:rq, :], op=nl.add)
    nisa.tensor_copy(dst=m[0:rq, :], src=m_new[0:rq, :])
    pv_ps = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.psum)
    for c in nl.static_range(0, kc, PMAX):  # 128 keys per transpose; P V accumulates in PSUM
        kk = min(PMAX, kc - c)
        pT_ps = nl.ndarray((PMAX, PMAX), dtype=vr.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=pT_ps[0:kk, 0:rq], data=p[0:rq, c : c + kk])
        pT = nl.ndarray((PMAX, PMAX), dtype=vr.dtype, buffer=nl.sbuf)
        if (c // PMAX) % 2:  # evictions alternate between the Scalar and Vector engines
            nisa.activation(dst=pT[0:kk, 0:rq], op=nl.copy, data=pT_ps[0:kk, 0:rq])
        else:
            nisa.tensor_copy(dst=pT[0:kk, 0:rq], src=pT_ps[0:kk, 0:rq])
        nisa.nc_matmul(
            dst=pv_ps[0:rq, :], stationary=pT[0:kk, 0:rq], moving=vr[0:kk, (k0 + c) // PMAX, :]
        )
    nisa.tensor_scalar(
        dst=acc[0:rq, :], data=acc[0:rq, :], op0=nl.multiply, operand0=alpha[0:rq, :]
    )
    nisa.tensor_tensor(dst=acc[0:rq, :], data1=acc[0:rq, :], data2=pv_ps[0:rq, :], op=nl.add)


def _query_tile(q, o, lse, b, h, q0, rq, kT, vr, scale):
    d = q.shape[3]
    qT = _load_transposed(q[b, h, q0 : q0 + rq, :], q.dtype, rq, d)
    m = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    l_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    acc = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
    neg = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=m[0:rq, :], value=NEG_BIG)
    nisa.memset(dst=l_sum[0:rq, :], value=0.0)
    nisa.memset(dst=acc[0:rq, :], value=0.0)
    # keys up to the tile's last row; every row has an unmasked key in every chunk, since
    # chunks start at multiples of 512 <= q0
    for k0 in nl.static_range(0, q0 + rq, KCHUNK):
        kc = min(KCHUNK, q0 + rq - k0)
        _key_chunk(qT, kT, vr, (m, l_sum, acc, neg), q0, rq, k0, kc, scale)
    inv = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv[0:rq, :], data=l_sum[0:rq, :])
    ot = nl.ndarray((PMAX, d), dtype=q.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ot[0:rq, :], data=acc[0:rq, :], op0=nl.multiply, operand0=inv[0:rq, :])
    nisa.dma_copy(dst=o[b, h, q0 : q0 + rq, :], src=ot[0:rq, :])
    # lse of the scaled scores: scale * m + log l = log l - neg
    lt = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=lt[0:rq, :], op=nl.log, data=l_sum[0:rq, :])
    nisa.tensor_tensor(dst=lt[0:rq, :], data1=lt[0:rq, :], data2=neg[0:rq, :], op=nl.subtract)
    nisa.dma_copy(dst=lse[b, h, q0 : q0 + rq, :], src=lt[0:rq, :])


def _kv_head(q, k, v, o, lse, b, kvh, scale):
    t, d = q.shape[2], q.shape[3]
    group = q.shape[1] // k.shape[1]
    nt = -(-t // PMAX)
    kr = nl.ndarray((PMAX, nt, d), dtype=k.dtype, buffer=nl.sbuf)
    kT = nl.ndarray((d, nt * PMAX), dtype=k.dtype, buffer=nl.sbuf)
    vr = nl.ndarray((PMAX, nt, d), dtype=v.dtype, buffer=nl.sbuf)
    _load_kv(k, v, b, kvh, kr, kT, vr)
    for r in nl.static_range(group):
        for q0 in nl.static_range(0, t, PMAX):
            _query_tile(q, o, lse, b, kvh * group + r, q0, min(PMAX, t - q0), kT, vr, scale)


@nki.jit
def attention_fwd(q, k, v, scale):
    """q [B, H, T, D], k/v [B, Hkv, T, D] -> (o [B, H, T, D], lse [B, H, T, 1] float32)."""
    bsz, heads, t, d = q.shape
    kv_heads = k.shape[1]
    o = nl.ndarray((bsz, heads, t, d), dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((bsz, heads, t, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    # work items: (batch row, KV head); K^T and V are loaded once per item
    first, count = _share(bsz * kv_heads)
    for j in nl.affine_range(count):
        _kv_head(q, k, v, o, lse, (first + j) // kv_heads, (first + j) % kv_heads, scale)
    return o, lse
