"""Causal attention, flash-style (online softmax), with grouped-query attention. Forward.

    o = softmax(scale * q k^T + causal mask) v,   q [B, H, T, D], k/v [B, Hkv, T, D]

Query head h reads key/value head h // (H / Hkv). D <= 128 (one matmul contraction).
For every 128-row query tile the kernel walks key tiles 0..diagonal (tiles above the
diagonal are skipped outright; only the diagonal tile needs a mask), keeping a running
row max m, running sum l and an unnormalised accumulator in SBUF:

    S = scale * Q K^T                  (Tensor Engine: Q^T, K^T tiles with D on partitions)
    m' = max(m, rowmax S);  P = exp(S - m');  l = l e^(m - m') + rowsum P
    acc = acc e^(m - m') + P V         (P transposed on the Tensor Engine to put keys on partitions)

and finally o = acc / l, lse = m + log l (float32, [B, H, T, 1], kept for a backward).

The backward is not a kernel: the custom op recomputes attention with the PyTorch
reference and differentiates it (see trnfrontier/runtime/kernels/custom_ops.py).
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128
NEG_BIG = -1.0e30  # masked scores: finite so that exp(NEG_BIG - m) is exactly 0, never NaN


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


def _query_tile(q, k, v, o, lse, b, h, kvh, q0, rq, scale):
    d = q.shape[3]
    qT = _load_transposed(q[b, h, q0 : q0 + rq, :], q.dtype, rq, d)
    m = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    l_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    acc = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=m[0:rq, :], value=NEG_BIG)
    nisa.memset(dst=l_sum[0:rq, :], value=0.0)
    nisa.memset(dst=acc[0:rq, :], value=0.0)
    # key tiles share the query tiling, so the diagonal tile starts at k0 == q0
    for k0 in nl.static_range(0, q0 + 1, PMAX):
        rk = min(PMAX, q.shape[2] - k0)
        kT = _load_transposed(k[b, kvh, k0 : k0 + rk, :], k.dtype, rk, d)
        vt = nl.ndarray((PMAX, d), dtype=v.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=vt[0:rk, :], src=v[b, kvh, k0 : k0 + rk, :])
        s_ps = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps[0:rq, 0:rk], stationary=qT[:, 0:rq], moving=kT[:, 0:rk])
        s = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=s[0:rq, 0:rk], op=nl.copy, data=s_ps[0:rq, 0:rk], scale=scale)
        if k0 == q0:
            # keep key x of query row p where (q0 + p) - (k0 + x) >= 0
            nisa.affine_select(
                dst=s[0:rq, 0:rk],
                pattern=[[-1, rk]],
                channel_multiplier=1,
                on_true_tile=s[0:rq, 0:rk],
                on_false_value=NEG_BIG,
                cmp_op=nl.greater_equal,
                offset=q0 - k0,
            )
        cmax = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(
            dst=cmax[0:rq, :], op=nl.maximum, data=s[0:rq, 0:rk], axis=1, keepdims=True
        )
        m_new = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=m_new[0:rq, :], data1=m[0:rq, :], data2=cmax[0:rq, :], op=nl.maximum)
        neg = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg[0:rq, :], data=m_new[0:rq, :], op0=nl.multiply, operand0=-1.0)
        p = nl.ndarray((PMAX, PMAX), dtype=v.dtype, buffer=nl.sbuf)
        psum_row = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(
            dst=p[0:rq, 0:rk],
            op=nl.exp,
            data=s[0:rq, 0:rk],
            bias=neg[0:rq, :],
            reduce_op=nl.add,
            reduce_res=psum_row[0:rq, :],
        )
        alpha = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=alpha[0:rq, :], op=nl.exp, data=m[0:rq, :], bias=neg[0:rq, :])
        nisa.tensor_tensor(
            dst=l_sum[0:rq, :], data1=l_sum[0:rq, :], data2=alpha[0:rq, :], op=nl.multiply
        )
        nisa.tensor_tensor(
            dst=l_sum[0:rq, :], data1=l_sum[0:rq, :], data2=psum_row[0:rq, :], op=nl.add
        )
        nisa.tensor_copy(dst=m[0:rq, :], src=m_new[0:rq, :])
        pT_ps = nl.ndarray((PMAX, PMAX), dtype=v.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=pT_ps[0:rk, 0:rq], data=p[0:rq, 0:rk])
        pT = nl.ndarray((PMAX, PMAX), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pT[0:rk, 0:rq], src=pT_ps[0:rk, 0:rq])
        pv_ps = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=pv_ps[0:rq, :], stationary=pT[0:rk, 0:rq], moving=vt[0:rk, :])
        nisa.tensor_scalar(
            dst=acc[0:rq, :], data=acc[0:rq, :], op0=nl.multiply, operand0=alpha[0:rq, :]
        )
        nisa.tensor_tensor(dst=acc[0:rq, :], data1=acc[0:rq, :], data2=pv_ps[0:rq, :], op=nl.add)
    inv = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv[0:rq, :], data=l_sum[0:rq, :])
    ot = nl.ndarray((PMAX, d), dtype=q.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=ot[0:rq, :], data=acc[0:rq, :], op0=nl.multiply, operand0=inv[0:rq, :])
    nisa.dma_copy(dst=o[b, h, q0 : q0 + rq, :], src=ot[0:rq, :])
    lt = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=lt[0:rq, :], op=nl.log, data=l_sum[0:rq, :])
    nisa.tensor_tensor(dst=lt[0:rq, :], data1=lt[0:rq, :], data2=m[0:rq, :], op=nl.add)
    nisa.dma_copy(dst=lse[b, h, q0 : q0 + rq, :], src=lt[0:rq, :])


@nki.jit
def attention_fwd(q, k, v, scale):
    """q [B, H, T, D], k/v [B, Hkv, T, D] -> (o [B, H, T, D], lse [B, H, T, 1] float32)."""
    bsz, heads, t, d = q.shape
    group = heads // k.shape[1]
    o = nl.ndarray((bsz, heads, t, d), dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((bsz, heads, t, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    # work items: (batch row, query head); the grid's programs split them. Query head h
    # reads kv head h // group.
    first, count = _share(bsz * heads)
    for j in nl.affine_range(count):
        b = (first + j) // heads
        h = (first + j) % heads
        # the number of key tiles (and the diagonal) depends on the query tile
        for q0 in nl.static_range(0, t, PMAX):
            _query_tile(q, k, v, o, lse, b, h, h // group, q0, min(PMAX, t - q0), scale)
    return o, lse
