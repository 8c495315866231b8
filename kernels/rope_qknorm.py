"""Rotary embedding fused with the parameter-free QK RMSNorm, forward and backward.

    z = rotate(x):  z1 = x1 cos + x2 sin,  z2 = x2 cos - x1 sin   (x1, x2: the two halves)
    y = z * rstd,   rstd = 1 / sqrt(mean(z^2) + eps)              (skipped when normalize=False)

Layout: x is [B, T, H, D], the layout the model's q and k have in memory before their
[B, H, T, D] view (the op passes that view's transpose, so nothing is copied in HBM).
A tile is 128 positions of one batch row with all H heads: one DMA in and one out per
tile. Every instruction works on all H heads at once: the [P, H, D] tile's two halves
are strided views, cos/sin [T, D/2] float32 (loaded once per tile) are broadcast over
the heads (``cs.expand_dim(1).broadcast(1, H)``), the sum of squares is one reduction
over D giving [P, H], and rstd is broadcast back over D. The forward returns rstd as
[B, T, H] float32 (RSTD_LAYOUT: one small DMA per tile; all ones when normalize=False)
for the backward, which recomputes z instead of storing it:

    dz = rstd * dy - z * rstd^3 * mean(dy * z)       (dz = dy when normalize=False)
    dx1 = dz1 cos - dz2 sin,   dx2 = dz1 sin + dz2 cos
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128
RSTD_LAYOUT = "bTh"  # the forward's rstd is [B, T, H] (budget_table reads this)


def _share(n_items):
    """(first, count): this program's contiguous share of n_items under the launch grid."""
    pid, nprog = nl.program_id(0), nl.num_programs(0)
    base, extra = n_items // nprog, n_items % nprog
    return pid * base + min(pid, extra), base + (1 if pid < extra else 0)


def _halves(t, rows, half):
    """The two halves of every head of a [P, H, D] tile, as [rows, H, D/2] views."""
    return t[0:rows, :, 0:half], t[0:rows, :, half : 2 * half]


def _rotate(src, cs, sn, dst, rows, heads, half, sign):
    """dst = R src (sign=+1) or R^T src (sign=-1), all heads at once; [P, H, D] tiles."""
    x1, x2 = _halves(src, rows, half)
    z1, z2 = _halves(dst, rows, half)
    c = cs[0:rows, :].expand_dim(1).broadcast(1, heads)
    s = sn[0:rows, :].expand_dim(1).broadcast(1, heads)
    a = nl.ndarray((PMAX, heads, half), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((PMAX, heads, half), dtype=nl.float32, buffer=nl.sbuf)
    # first half: x1 cos + sign * x2 sin
    nisa.tensor_tensor(dst=a[0:rows], data1=x1, data2=c, op=nl.multiply)
    nisa.tensor_tensor(dst=b[0:rows], data1=x2, data2=s, op=nl.multiply)
    nisa.tensor_tensor(
        dst=z1, data1=a[0:rows], data2=b[0:rows], op=nl.add if sign > 0 else nl.subtract
    )
    # second half: x2 cos - sign * x1 sin
    nisa.tensor_tensor(dst=a[0:rows], data1=x2, data2=c, op=nl.multiply)
    nisa.tensor_tensor(dst=b[0:rows], data1=x1, data2=s, op=nl.multiply)
    nisa.tensor_tensor(
        dst=z2, data1=a[0:rows], data2=b[0:rows], op=nl.subtract if sign > 0 else nl.add
    )


def _rstd(z, rs, rows, heads, d, eps):
    """rs[:, h] = 1 / sqrt(mean over D of z[:, h, :]^2 + eps), every head at once."""
    sq = nl.ndarray((PMAX, heads, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq[0:rows], op=nl.square, data=z[0:rows])
    ms = nl.ndarray((PMAX, heads), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=ms[0:rows, :], op=nl.add, data=sq[0:rows], axis=2)
    nisa.tensor_scalar(
        dst=ms[0:rows, :],
        data=ms[0:rows, :],
        op0=nl.multiply,
        operand0=1.0 / d,
        op1=nl.add,
        operand1=eps,
    )
    nisa.activation(dst=rs[0:rows, :], op=nl.rsqrt, data=ms[0:rows, :])


def _over_d(v, rows, d):
    """A [P, H] per-head value broadcast over D: [rows, H, D]."""
    return v[0:rows, :].expand_dim(2).broadcast(2, d)


def _load_angles(cos, sin, t0, rows):
    half = cos.shape[1]
    cs = nl.ndarray((PMAX, half), dtype=cos.dtype, buffer=nl.sbuf)
    sn = nl.ndarray((PMAX, half), dtype=sin.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=cs[0:rows, :], src=cos[t0 : t0 + rows, :])
    nisa.dma_copy(dst=sn[0:rows, :], src=sin[t0 : t0 + rows, :])
    return cs, sn


def _fwd_block(x, cos, sin, y, rstd, b, t0, rows, eps, normalize):
    heads, d = x.shape[2], x.shape[3]
    cs, sn = _load_angles(cos, sin, t0, rows)
    xt = nl.ndarray((PMAX, heads, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[0:rows], src=x[b, t0 : t0 + rows, :, :])
    yt = nl.ndarray((PMAX, heads, d), dtype=x.dtype, buffer=nl.sbuf)
    rs = nl.ndarray((PMAX, heads), dtype=nl.float32, buffer=nl.sbuf)
    if normalize:
        z = nl.ndarray((PMAX, heads, d), dtype=nl.float32, buffer=nl.sbuf)
        _rotate(xt, cs, sn, z, rows, heads, d // 2, 1)
        _rstd(z, rs, rows, heads, d, eps)
        nisa.tensor_tensor(
            dst=yt[0:rows], data1=z[0:rows], data2=_over_d(rs, rows, d), op=nl.multiply
        )
    else:
        _rotate(xt, cs, sn, yt, rows, heads, d // 2, 1)
        nisa.memset(dst=rs[0:rows, :], value=1.0)
    nisa.dma_copy(dst=y[b, t0 : t0 + rows, :, :], src=yt[0:rows])
    nisa.dma_copy(dst=rstd[b, t0 : t0 + rows, :], src=rs[0:rows, :])


@nki.jit
def rope_qknorm_fwd(x, cos, sin, eps, normalize):
    """x [B, T, H, D], cos/sin [T, D/2] -> (y [B, T, H, D], rstd [B, T, H] float32)."""
    bsz, t, heads, d = x.shape
    y = nl.ndarray((bsz, t, heads, d), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((bsz, t, heads), dtype=nl.float32, buffer=nl.shared_hbm)
    # work items: (batch row, 128-position block); the grid's programs split them
    nblk = -(-t // PMAX)
    first, count = _share(bsz * nblk)
    for j in nl.affine_range(count):
        b = (first + j) // nblk
        t0 = ((first + j) % nblk) * PMAX
        _fwd_block(x, cos, sin, y, rstd, b, t0, min(PMAX, t - t0), eps, normalize)
    return y, rstd


def _dz_normalized(z, gt, rs, dz, rows, heads, d):
    """dz = rstd * dy - z * rstd^3 * mean(dy * z), every head at once (z is overwritten)."""
    prod = nl.ndarray((PMAX, heads, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod[0:rows], data1=z[0:rows], data2=gt[0:rows], op=nl.multiply)
    coef = nl.ndarray((PMAX, heads), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=coef[0:rows, :], op=nl.add, data=prod[0:rows], axis=2)
    r3 = nl.ndarray((PMAX, heads), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r3[0:rows, :], data1=rs[0:rows, :], data2=rs[0:rows, :], op=nl.multiply)
    nisa.tensor_tensor(dst=r3[0:rows, :], data1=r3[0:rows, :], data2=rs[0:rows, :], op=nl.multiply)
    # coef = -rstd^3 * sum(dy * z) / d
    nisa.tensor_tensor(
        dst=coef[0:rows, :], data1=coef[0:rows, :], data2=r3[0:rows, :], op=nl.multiply
    )
    nisa.tensor_scalar(
        dst=coef[0:rows, :], data=coef[0:rows, :], op0=nl.multiply, operand0=-1.0 / d
    )
    a = nl.ndarray((PMAX, heads, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=a[0:rows], data1=gt[0:rows], data2=_over_d(rs, rows, d), op=nl.multiply)
    nisa.tensor_tensor(
        dst=z[0:rows], data1=z[0:rows], data2=_over_d(coef, rows, d), op=nl.multiply
    )
    nisa.tensor_tensor(dst=dz[0:rows], data1=a[0:rows], data2=z[0:rows], op=nl.add)


def _bwd_block(x, dy, cos, sin, rstd, dx, b, t0, rows, normalize):
    heads, d = x.shape[2], x.shape[3]
    cs, sn = _load_angles(cos, sin, t0, rows)
    gt = nl.ndarray((PMAX, heads, d), dtype=dy.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=gt[0:rows], src=dy[b, t0 : t0 + rows, :, :])
    out = nl.ndarray((PMAX, heads, d), dtype=x.dtype, buffer=nl.sbuf)
    if normalize:
        xt = nl.ndarray((PMAX, heads, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:rows], src=x[b, t0 : t0 + rows, :, :])
        rs = nl.ndarray((PMAX, heads), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rs[0:rows, :], src=rstd[b, t0 : t0 + rows, :])
        z = nl.ndarray((PMAX, heads, d), dtype=nl.float32, buffer=nl.sbuf)
        _rotate(xt, cs, sn, z, rows, heads, d // 2, 1)
        dz = nl.ndarray((PMAX, heads, d), dtype=nl.float32, buffer=nl.sbuf)
        _dz_normalized(z, gt, rs, dz, rows, heads, d)
        _rotate(dz, cs, sn, out, rows, heads, d // 2, -1)
    else:
        _rotate(gt, cs, sn, out, rows, heads, d // 2, -1)
    nisa.dma_copy(dst=dx[b, t0 : t0 + rows, :, :], src=out[0:rows])


@nki.jit
def rope_qknorm_bwd(x, dy, cos, sin, rstd, normalize):
    """dx [B, T, H, D] given x, dy [B, T, H, D] and the forward's rstd [B, T, H]."""
    bsz, t, heads, d = x.shape
    dx = nl.ndarray((bsz, t, heads, d), dtype=x.dtype, buffer=nl.shared_hbm)
    # work items: (batch row, 128-position block); the grid's programs split them
    nblk = -(-t // PMAX)
    first, count = _share(bsz * nblk)
    for j in nl.affine_range(count):
        b = (first + j) // nblk
        t0 = ((first + j) % nblk) * PMAX
        _bwd_block(x, dy, cos, sin, rstd, dx, b, t0, min(PMAX, t - t0), normalize)
    return dx
