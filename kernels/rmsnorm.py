"""Parameter-free RMSNorm over the last dimension, forward and backward.

    y = x * rstd,  rstd = 1 / sqrt(mean(x^2) + eps)
    dx = rstd * dy - x * rstd^3 * mean(dy * x)

Layout: x is [N, D] in HBM, rows on partitions, a whole row in one tile (the reduction
runs along the free axis on the Scalar/Vector engines, no cross-partition traffic).
The forward also returns rstd [N, 1] (float32) so the backward does not recompute it.
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


def _last_program():
    """The program that takes the ragged tail tile (the only one without a grid)."""
    return nl.program_id(0) == nl.num_programs(0) - 1


def _fwd_tile(x, y, rstd, r0, rows, eps):
    d = x.shape[1]
    xt = nl.ndarray((PMAX, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[0:rows, :], src=x[r0 : r0 + rows, :])
    sq = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
    sumsq = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(
        dst=sq[0:rows, :],
        op=nl.square,
        data=xt[0:rows, :],
        reduce_op=nl.add,
        reduce_res=sumsq[0:rows, :],
    )
    ms = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=ms[0:rows, :],
        data=sumsq[0:rows, :],
        op0=nl.multiply,
        operand0=1.0 / d,
        op1=nl.add,
        operand1=eps,
    )
    rs = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rs[0:rows, :], op=nl.rsqrt, data=ms[0:rows, :])
    yt = nl.ndarray((PMAX, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=yt[0:rows, :], data=xt[0:rows, :], op0=nl.multiply, operand0=rs[0:rows, :]
    )
    nisa.dma_copy(dst=y[r0 : r0 + rows, :], src=yt[0:rows, :])
    nisa.dma_copy(dst=rstd[r0 : r0 + rows, :], src=rs[0:rows, :])


@nki.jit
def rmsnorm_fwd(x, eps):
    """x [N, D] -> (y [N, D] in x's dtype, rstd [N, 1] float32)."""
    n, d = x.shape
    y = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    first, count = _share(n // PMAX)
    for j in nl.affine_range(count):
        _fwd_tile(x, y, rstd, (first + j) * PMAX, PMAX, eps)
    if n % PMAX and _last_program():
        _fwd_tile(x, y, rstd, n - n % PMAX, n % PMAX, eps)
    return y, rstd


def _bwd_tile(x, dy, rstd, dx, r0, rows):
    d = x.shape[1]
    xt = nl.ndarray((PMAX, d), dtype=x.dtype, buffer=nl.sbuf)
    gt = nl.ndarray((PMAX, d), dtype=dy.dtype, buffer=nl.sbuf)
    rs = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[0:rows, :], src=x[r0 : r0 + rows, :])
    nisa.dma_copy(dst=gt[0:rows, :], src=dy[r0 : r0 + rows, :])
    nisa.dma_copy(dst=rs[0:rows, :], src=rstd[r0 : r0 + rows, :])
    prod = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(
        dst=prod[0:rows, :], data1=xt[0:rows, :], data2=gt[0:rows, :], op=nl.multiply
    )
    dot = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=dot[0:rows, :], op=nl.add, data=prod[0:rows, :], axis=1, keepdims=True)
    # coef = -rstd^3 * dot / d
    r2 = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r2[0:rows, :], data1=rs[0:rows, :], data2=rs[0:rows, :], op=nl.multiply)
    r3 = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r3[0:rows, :], data1=r2[0:rows, :], data2=rs[0:rows, :], op=nl.multiply)
    coef = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(
        dst=coef[0:rows, :], data1=r3[0:rows, :], data2=dot[0:rows, :], op=nl.multiply
    )
    nisa.tensor_scalar(
        dst=coef[0:rows, :], data=coef[0:rows, :], op0=nl.multiply, operand0=-1.0 / d
    )
    a = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=a[0:rows, :], data=gt[0:rows, :], op0=nl.multiply, operand0=rs[0:rows, :]
    )
    b = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(
        dst=b[0:rows, :], data=xt[0:rows, :], op0=nl.multiply, operand0=coef[0:rows, :]
    )
    out = nl.ndarray((PMAX, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=out[0:rows, :], data1=a[0:rows, :], data2=b[0:rows, :], op=nl.add)
    nisa.dma_copy(dst=dx[r0 : r0 + rows, :], src=out[0:rows, :])


@nki.jit
def rmsnorm_bwd(x, dy, rstd):
    """dx for y = rmsnorm(x), given dy [N, D] and the forward's rstd [N, 1]."""
    n, d = x.shape
    dx = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    first, count = _share(n // PMAX)
    for j in nl.affine_range(count):
        _bwd_tile(x, dy, rstd, dx, (first + j) * PMAX, PMAX)
    if n % PMAX and _last_program():
        _bwd_tile(x, dy, rstd, dx, n - n % PMAX, n % PMAX)
    return dx
