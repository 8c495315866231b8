"""Rotary embedding fused with the parameter-free QK RMSNorm, forward and backward.

    z = rotate(x):  z1 = x1 cos + x2 sin,  z2 = x2 cos - x1 sin   (x1, x2: the two halves)
    y = z * rstd,   rstd = 1 / sqrt(mean(z^2) + eps)              (skipped when normalize=False)

Layout: x is [B, T, H, D], the layout the model's q and k have in memory before their
[B, H, T, D] view (the op passes that view's transpose, so nothing is copied in HBM).
Position groups: a work item is g * 128 consecutive positions of one batch row,
partition p holding positions t0 + p * g .. + g with all H heads (a [128, g, H, D] tile,
g * H * D elements contiguous per partition, in the positions' own flat order), so x,
y, dy, dx, cos/sin and rstd each move in one DMA per item; g keeps a float32 work tile
near 16 KiB a partition. A batch row's last T % 128 positions are one more item of one
position per partition.

Every instruction works on all g positions and H heads of a partition at once: the two
halves are strided views, cos/sin [T, D/2] float32 are broadcast over the heads
(``cs.expand_dim(2).broadcast(2, H)``), the sum of squares is one reduction over D
giving [128, g, H], and rstd is broadcast back over D. The forward returns rstd as
[B, T, H] float32 (RSTD_LAYOUT; all ones when normalize=False) for the backward, which
recomputes z instead of storing it:

    dz = rstd * dy - z * rstd^3 * mean(dy * z)       (dz = dy when normalize=False)
    dx1 = dz1 cos - dz2 sin,   dx2 = dz1 sin + dz2 cos
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128
RSTD_LAYOUT = "bTh"  # the forward's rstd is [B, T, H] (budget_table reads this)
GROUP_ELEMS = 4096  # float32 elements a partition per work tile: 16 KiB


def _share(n_items):
    """(first, count): this program's contiguous share of n_items under the launch grid."""
    pid, nprog = nl.program_id(0), nl.num_programs(0)
    base, extra = n_items // nprog, n_items % nprog
    return pid * base + min(pid, extra), base + (1 if pid < extra else 0)


def _plan(t, heads, d):
    """(positions per partition g, full-tile groups per batch row, items per batch row)."""
    g = max(1, GROUP_ELEMS // (heads * d))
    full = t // PMAX
    groups = -(-full // g)
    return g, groups, groups + (1 if t % PMAX else 0)


def _item(t, g, groups, k):
    """Item k of a batch row: (first position, partitions used, positions per partition)."""
    if k < groups:
        return k * g * PMAX, PMAX, min(g, t // PMAX - k * g)
    return (t // PMAX) * PMAX, t % PMAX, 1


def _halves(t, parts, half):
    """The two halves of every head of a [P, g, H, D] tile, as [parts, g, H, D/2] views."""
    return t[0:parts, :, :, 0:half], t[0:parts, :, :, half : 2 * half]


def _rotate(src, cs, sn, dst, parts, heads, half, sign):
    """dst = R src (sign=+1) or R^T src (sign=-1) for every position and head at once."""
    g = src.shape[1]
    x1, x2 = _halves(src, parts, half)
    z1, z2 = _halves(dst, parts, half)
    c = cs[0:parts].expand_dim(2).broadcast(2, heads)
    s = sn[0:parts].expand_dim(2).broadcast(2, heads)
    a = nl.ndarray((PMAX, g, heads, half), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((PMAX, g, heads, half), dtype=nl.float32, buffer=nl.sbuf)
    # first half: x1 cos + sign * x2 sin
    nisa.tensor_tensor(dst=a[0:parts], data1=x1, data2=c, op=nl.multiply)
    nisa.tensor_tensor(dst=b[0:parts], data1=x2, data2=s, op=nl.multiply)
    nisa.tensor_tensor(
        dst=z1, data1=a[0:parts], data2=b[0:parts], op=nl.add if sign > 0 else nl.subtract
    )
    # second half: x2 cos - sign * x1 sin
    nisa.tensor_tensor(dst=a[0:parts], data1=x2, data2=c, op=nl.multiply)
    nisa.tensor_tensor(dst=b[0:parts], data1=x1, data2=s, op=nl.multiply)
    nisa.tensor_tensor(
        dst=z2, data1=a[0:parts], data2=b[0:parts], op=nl.subtract if sign > 0 else nl.add
    )


def _rstd(z, rs, parts, d, eps):
    """rs[p, j, h] = 1 / sqrt(mean over D of z[p, j, h, :]^2 + eps), all at once."""
    sq = nl.ndarray(z.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq[0:parts], op=nl.square, data=z[0:parts])
    nisa.tensor_reduce(dst=rs[0:parts], op=nl.add, data=sq[0:parts], axis=3)
    nisa.tensor_scalar(
        dst=rs[0:parts],
        data=rs[0:parts],
        op0=nl.multiply,
        operand0=1.0 / d,
        op1=nl.add,
        operand1=eps,
    )
    nisa.activation(dst=rs[0:parts], op=nl.rsqrt, data=rs[0:parts])


def _over_d(v, parts, d):
    """A [P, g, H] per-head value broadcast over D: [parts, g, H, D]."""
    return v[0:parts].expand_dim(3).broadcast(3, d)


def _load_angles(cos, sin, t0, parts, g):
    half = cos.shape[1]
    cs = nl.ndarray((PMAX, g, half), dtype=cos.dtype, buffer=nl.sbuf)
    sn = nl.ndarray((PMAX, g, half), dtype=sin.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=cs[0:parts], src=cos[t0 : t0 + parts * g, :])
    nisa.dma_copy(dst=sn[0:parts], src=sin[t0 : t0 + parts * g, :])
    return cs, sn


def _fwd_item(x, cos, sin, y, rstd, b, t0, parts, g, eps, normalize):
    heads, d = x.shape[2], x.shape[3]
    n = parts * g
    cs, sn = _load_angles(cos, sin, t0, parts, g)
    xt = nl.ndarray((PMAX, g, heads, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[0:parts], src=x[b, t0 : t0 + n, :, :])
    yt = nl.ndarray((PMAX, g, heads, d), dtype=x.dtype, buffer=nl.sbuf)
    rs = nl.ndarray((PMAX, g, heads), dtype=nl.float32, buffer=nl.sbuf)
    if normalize:
        z = nl.ndarray((PMAX, g, heads, d), dtype=nl.float32, buffer=nl.sbuf)
        _rotate(xt, cs, sn, z, parts, heads, d // 2, 1)
        _rstd(z, rs, parts, d, eps)
        nisa.tensor_tensor(
            dst=yt[0:parts], data1=z[0:parts], data2=_over_d(rs, parts, d), op=nl.multiply
        )
    else:
        _rotate(xt, cs, sn, yt, parts, heads, d // 2, 1)
        nisa.memset(dst=rs[0:parts], value=1.0)
    nisa.dma_copy(dst=y[b, t0 : t0 + n, :, :], src=yt[0:parts])
    nisa.dma_copy(dst=rstd[b, t0 : t0 + n, :], src=rs[0:parts])


@nki.jit
def rope_qknorm_fwd(x, cos, sin, eps, normalize):
    """x [B, T, H, D], cos/sin [T, D/2] -> (y [B, T, H, D], rstd [B, T, H] float32)."""
    bsz, t, heads, d = x.shape
    y = nl.ndarray((bsz, t, heads, d), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((bsz, t, heads), dtype=nl.float32, buffer=nl.shared_hbm)
    g, groups, per_row = _plan(t, heads, d)
    # work items: (batch row, position group); the grid's programs split them
    first, count = _share(bsz * per_row)
    for j in nl.affine_range(count):
        t0, parts, gs = _item(t, g, groups, (first + j) % per_row)
        _fwd_item(x, cos, sin, y, rstd, (first + j) // per_row, t0, parts, gs, eps, normalize)
    return y, rstd


def _dz_normalized(z, gt, rs, dz, parts, d):
    """dz = rstd * dy - z * rstd^3 * mean(dy * z), all at once (z is overwritten)."""
    prod = nl.ndarray(z.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod[0:parts], data1=z[0:parts], data2=gt[0:parts], op=nl.multiply)
    coef = nl.ndarray(rs.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=coef[0:parts], op=nl.add, data=prod[0:parts], axis=3)
    r3 = nl.ndarray(rs.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r3[0:parts], data1=rs[0:parts], data2=rs[0:parts], op=nl.multiply)
    nisa.tensor_tensor(dst=r3[0:parts], data1=r3[0:parts], data2=rs[0:parts], op=nl.multiply)
    # coef = -rstd^3 * sum(dy * z) / d
    nisa.tensor_tensor(dst=coef[0:parts], data1=coef[0:parts], data2=r3[0:parts], op=nl.multiply)
    nisa.tensor_scalar(dst=coef[0:parts], data=coef[0:parts], op0=nl.multiply, operand0=-1.0 / d)
    nisa.tensor_tensor(
        dst=prod[0:parts], data1=gt[0:parts], data2=_over_d(rs, parts, d), op=nl.multiply
    )
    nisa.tensor_tensor(
        dst=z[0:parts], data1=z[0:parts], data2=_over_d(coef, parts, d), op=nl.multiply
    )
    nisa.tensor_tensor(dst=dz[0:parts], data1=prod[0:parts], data2=z[0:parts], op=nl.add)


def _bwd_item(x, dy, cos, sin, rstd, dx, b, t0, parts, g, normalize):
    heads, d = x.shape[2], x.shape[3]
    n = parts * g
    cs, sn = _load_angles(cos, sin, t0, parts, g)
    gt = nl.ndarray((PMAX, g, heads, d), dtype=dy.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=gt[0:parts], src=dy[b, t0 : t0 + n, :, :])
    out = nl.ndarray((PMAX, g, heads, d), dtype=x.dtype, buffer=nl.sbuf)
    if normalize:
        xt = nl.ndarray((PMAX, g, heads, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:parts], src=x[b, t0 : t0 + n, :, :])
        rs = nl.ndarray((PMAX, g, heads), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rs[0:parts], src=rstd[b, t0 : t0 + n, :])
        z = nl.ndarray((PMAX, g, heads, d), dtype=nl.float32, buffer=nl.sbuf)
        _rotate(xt, cs, sn, z, parts, heads, d // 2, 1)
        dz = nl.ndarray((PMAX, g, heads, d), dtype=nl.float32, buffer=nl.sbuf)
        _dz_normalized(z, gt, rs, dz, parts, d)
        _rotate(dz, cs, sn, out, parts, heads, d // 2, -1)
    else:
        _rotate(gt, cs, sn, out, parts, heads, d // 2, -1)
    nisa.dma_copy(dst=dx[b, t0 : t0 + n, :, :], src=out[0:parts])


@nki.jit
def rope_qknorm_bwd(x, dy, cos, sin, rstd, normalize):
    """dx [B, T, H, D] given x, dy [B, T, H, D] and the forward's rstd [B, T, H]."""
    bsz, t, heads, d = x.shape
    dx = nl.ndarray((bsz, t, heads, d), dtype=x.dtype, buffer=nl.shared_hbm)
    g, groups, per_row = _plan(t, heads, d)
    first, count = _share(bsz * per_row)
    for j in nl.affine_range(count):
        t0, parts, gs = _item(t, g, groups, (first + j) % per_row)
        _bwd_item(x, dy, cos, sin, rstd, dx, (first + j) // per_row, t0, parts, gs, normalize)
    return dx
