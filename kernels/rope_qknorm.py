"""Rotary embedding fused with the parameter-free QK RMSNorm, forward and backward.

    z = rotate(x):  z1 = x1 cos + x2 sin,  z2 = x2 cos - x1 sin   (x1, x2: the two halves)
    y = z * rstd,   rstd = 1 / sqrt(mean(z^2) + eps)              (skipped when normalize=False)

Layout: x is [B, H, T, D] (the model's q or k), cos/sin are [T, D/2] float32. A tile is
128 positions of one (batch, head) row; the cos/sin tiles of a block of positions are
loaded once and reused for every head. The forward returns rstd [B, H, T, 1] (all ones
when normalize=False) for the backward, which recomputes z instead of storing it:

    dz = rstd * dy - z * rstd^3 * mean(dy * z)       (dz = dy when normalize=False)
    dx1 = dz1 cos - dz2 sin,   dx2 = dz1 sin + dz2 cos
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128


def _share(n_items):
    """(first, count): this program's contiguous share of n_items under the launch grid."""
    pid, nprog = nl.program_id(0), nl.num_programs(0)
    base, extra = n_items // nprog, n_items % nprog
    return pid * base + min(pid, extra), base + (1 if pid < extra else 0)


def _rotate(xt, cs, sn, z, rows, half, sign):
    """z = R x (sign=+1) or R^T x (sign=-1) for one tile, in float32."""
    a = nl.ndarray((PMAX, half), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((PMAX, half), dtype=nl.float32, buffer=nl.sbuf)
    x1, x2 = xt[0:rows, 0:half], xt[0:rows, half : 2 * half]
    # first half: x1 cos + sign * x2 sin
    nisa.tensor_tensor(dst=a[0:rows, :], data1=x1, data2=cs[0:rows, :], op=nl.multiply)
    nisa.tensor_tensor(dst=b[0:rows, :], data1=x2, data2=sn[0:rows, :], op=nl.multiply)
    nisa.tensor_tensor(
        dst=z[0:rows, 0:half],
        data1=a[0:rows, :],
        data2=b[0:rows, :],
        op=nl.add if sign > 0 else nl.subtract,
    )
    # second half: x2 cos - sign * x1 sin
    nisa.tensor_tensor(dst=a[0:rows, :], data1=x2, data2=cs[0:rows, :], op=nl.multiply)
    nisa.tensor_tensor(dst=b[0:rows, :], data1=x1, data2=sn[0:rows, :], op=nl.multiply)
    nisa.tensor_tensor(
        dst=z[0:rows, half : 2 * half],
        data1=a[0:rows, :],
        data2=b[0:rows, :],
        op=nl.subtract if sign > 0 else nl.add,
    )


def _rstd(z, rs, rows, d, eps):
    sq = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
    sumsq = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(
        dst=sq[0:rows, :],
        op=nl.square,
        data=z[0:rows, :],
        reduce_op=nl.add,
        reduce_res=sumsq[0:rows, :],
    )
    nisa.tensor_scalar(
        dst=sumsq[0:rows, :],
        data=sumsq[0:rows, :],
        op0=nl.multiply,
        operand0=1.0 / d,
        op1=nl.add,
        operand1=eps,
    )
    nisa.activation(dst=rs[0:rows, :], op=nl.rsqrt, data=sumsq[0:rows, :])


def _load_angles(cos, sin, t0, rows):
    half = cos.shape[1]
    cs = nl.ndarray((PMAX, half), dtype=cos.dtype, buffer=nl.sbuf)
    sn = nl.ndarray((PMAX, half), dtype=sin.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=cs[0:rows, :], src=cos[t0 : t0 + rows, :])
    nisa.dma_copy(dst=sn[0:rows, :], src=sin[t0 : t0 + rows, :])
    return cs, sn


def _fwd_block(x, cos, sin, y, rstd, b, t0, rows, eps, normalize):
    d = x.shape[3]
    half = d // 2
    cs, sn = _load_angles(cos, sin, t0, rows)
    for h in nl.affine_range(x.shape[1]):
        xt = nl.ndarray((PMAX, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:rows, :], src=x[b, h, t0 : t0 + rows, :])
        z = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
        _rotate(xt, cs, sn, z, rows, half, 1)
        rs = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        if normalize:
            _rstd(z, rs, rows, d, eps)
        else:
            nisa.memset(dst=rs[0:rows, :], value=1.0)
        yt = nl.ndarray((PMAX, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(
            dst=yt[0:rows, :], data=z[0:rows, :], op0=nl.multiply, operand0=rs[0:rows, :]
        )
        nisa.dma_copy(dst=y[b, h, t0 : t0 + rows, :], src=yt[0:rows, :])
        nisa.dma_copy(dst=rstd[b, h, t0 : t0 + rows, :], src=rs[0:rows, :])


@nki.jit
def rope_qknorm_fwd(x, cos, sin, eps, normalize):
    """x [B, H, T, D], cos/sin [T, D/2] -> (y [B, H, T, D], rstd [B, H, T, 1] float32)."""
    bsz, heads, t, d = x.shape
    y = nl.ndarray((bsz, heads, t, d), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((bsz, heads, t, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    # work items: (batch row, 128-position block); the grid's programs split them
    nblk = -(-t // PMAX)
    first, count = _share(bsz * nblk)
    for j in nl.affine_range(count):
        b = (first + j) // nblk
        t0 = ((first + j) % nblk) * PMAX
        _fwd_block(x, cos, sin, y, rstd, b, t0, min(PMAX, t - t0), eps, normalize)
    return y, rstd


def _bwd_block(x, dy, cos, sin, rstd, dx, b, t0, rows, normalize):
    d = x.shape[3]
    half = d // 2
    cs, sn = _load_angles(cos, sin, t0, rows)
    for h in nl.affine_range(x.shape[1]):
        xt = nl.ndarray((PMAX, d), dtype=x.dtype, buffer=nl.sbuf)
        gt = nl.ndarray((PMAX, d), dtype=dy.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:rows, :], src=x[b, h, t0 : t0 + rows, :])
        nisa.dma_copy(dst=gt[0:rows, :], src=dy[b, h, t0 : t0 + rows, :])
        dz = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
        if normalize:
            rs = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=rs[0:rows, :], src=rstd[b, h, t0 : t0 + rows, :])
            z = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
            _rotate(xt, cs, sn, z, rows, half, 1)
            prod = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(
                dst=prod[0:rows, :], data1=z[0:rows, :], data2=gt[0:rows, :], op=nl.multiply
            )
            coef = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(
                dst=coef[0:rows, :], op=nl.add, data=prod[0:rows, :], axis=1, keepdims=True
            )
            r3 = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(
                dst=r3[0:rows, :], data1=rs[0:rows, :], data2=rs[0:rows, :], op=nl.multiply
            )
            nisa.tensor_tensor(
                dst=r3[0:rows, :], data1=r3[0:rows, :], data2=rs[0:rows, :], op=nl.multiply
            )
            nisa.tensor_tensor(
                dst=coef[0:rows, :], data1=coef[0:rows, :], data2=r3[0:rows, :], op=nl.multiply
            )
            nisa.tensor_scalar(
                dst=coef[0:rows, :], data=coef[0:rows, :], op0=nl.multiply, operand0=-1.0 / d
            )
            a = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(
                dst=a[0:rows, :], data=gt[0:rows, :], op0=nl.multiply, operand0=rs[0:rows, :]
            )
            nisa.tensor_scalar(
                dst=z[0:rows, :], data=z[0:rows, :], op0=nl.multiply, operand0=coef[0:rows, :]
            )
            nisa.tensor_tensor(dst=dz[0:rows, :], data1=a[0:rows, :], data2=z[0:rows, :], op=nl.add)
        else:
            nisa.tensor_copy(dst=dz[0:rows, :], src=gt[0:rows, :])
        g = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
        _rotate(dz, cs, sn, g, rows, half, -1)
        out = nl.ndarray((PMAX, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out[0:rows, :], src=g[0:rows, :])
        nisa.dma_copy(dst=dx[b, h, t0 : t0 + rows, :], src=out[0:rows, :])


@nki.jit
def rope_qknorm_bwd(x, dy, cos, sin, rstd, normalize):
    """dx [B, H, T, D] given dy and the forward's rstd; cos/sin get no gradient."""
    bsz, heads, t, d = x.shape
    dx = nl.ndarray((bsz, heads, t, d), dtype=x.dtype, buffer=nl.shared_hbm)
    # work items: (batch row, 128-position block); the grid's programs split them
    nblk = -(-t // PMAX)
    first, count = _share(bsz * nblk)
    for j in nl.affine_range(count):
        b = (first + j) // nblk
        t0 = ((first + j) % nblk) * PMAX
        _bwd_block(x, dy, cos, sin, rstd, dx, b, t0, min(PMAX, t - t0), normalize)
    return dx
