"""Parameter-free RMSNorm over the last dimension, forward and backward.

    y = x * rstd,  rstd = 1 / sqrt(mean(x^2) + eps)
    dx = rstd * dy - x * rstd^3 * mean(dy * x)

Layout: x is [N, D] in HBM, rows on partitions, whole rows in a tile (the reduction
runs along the free axis on the Scalar/Vector engines, no cross-partition traffic).
Row groups: a program's full row tiles are taken g at a time (g rows per partition,
about 32 KiB of float32 work per partition), partition p holding rows r + p * g .. +g,
so x, y, dy and dx move as one [128, g, D] DMA per group (g * D elements contiguous per
partition, in the rows' own flat order) and every instruction covers the g rows of a
partition at once (per-row values are [128, g] tiles broadcast over D). The forward
also returns rstd [N, 1] (float32, one [128, g] store per group) so the backward does
not recompute it. The ragged tail (N % 128 rows) is a group of one row per partition.
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


def _row_groups(n, d):
    """This program's work as [(first row, partitions, rows per partition)]: groups of g
    full row tiles (about 32 KiB of float32 work a partition), then the ragged tail."""
    first, count = _share(n // PMAX)
    group = max(1, 8192 // d)
    groups = []
    for g0 in nl.static_range(0, count, group):
        groups.append(((first + g0) * PMAX, PMAX, min(group, count - g0)))
    if n % PMAX and _last_program():
        groups.append((n - n % PMAX, n % PMAX, 1))
    return groups


def _fwd_rows(x, y, rstd, r0, parts, g, eps):
    """Rows r0 + p * g + j (partition p < parts, j < g): y and rstd, one DMA each way."""
    d = x.shape[1]
    n_rows = parts * g
    xt = nl.ndarray((PMAX, g, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[0:parts], src=x[r0 : r0 + n_rows, :])
    sq = nl.ndarray((PMAX, g, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq[0:parts], op=nl.square, data=xt[0:parts])
    rs = nl.ndarray((PMAX, g), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=rs[0:parts, :], op=nl.add, data=sq[0:parts], axis=2)
    nisa.tensor_scalar(
        dst=rs[0:parts, :],
        data=rs[0:parts, :],
        op0=nl.multiply,
        operand0=1.0 / d,
        op1=nl.add,
        operand1=eps,
    )
    nisa.activation(dst=rs[0:parts, :], op=nl.rsqrt, data=rs[0:parts, :])
    yt = nl.ndarray((PMAX, g, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(
        dst=yt[0:parts],
        data1=xt[0:parts],
        data2=rs[0:parts, :].expand_dim(2).broadcast(2, d),
        op=nl.multiply,
    )
    nisa.dma_copy(dst=y[r0 : r0 + n_rows, :], src=yt[0:parts])
    nisa.dma_copy(dst=rstd[r0 : r0 + n_rows, :], src=rs[0:parts, :])


@nki.jit
def rmsnorm_fwd(x, eps):
    """x [N, D] -> (y [N, D] in x's dtype, rstd [N, 1] float32)."""
    n, d = x.shape
    y = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    for item in _row_groups(n, d):
        _fwd_rows(x, y, rstd, item[0], item[1], item[2], eps)
    return y, rstd


def _bwd_rows(x, dy, rstd, dx, r0, parts, g):
    """dx = rstd * dy - x * rstd^3 * mean(dy * x) for rows r0 + p * g + j."""
    d = x.shape[1]
    n_rows = parts * g
    xt = nl.ndarray((PMAX, g, d), dtype=x.dtype, buffer=nl.sbuf)
    gt = nl.ndarray((PMAX, g, d), dtype=dy.dtype, buffer=nl.sbuf)
    rs = nl.ndarray((PMAX, g), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt[0:parts], src=x[r0 : r0 + n_rows, :])
    nisa.dma_copy(dst=gt[0:parts], src=dy[r0 : r0 + n_rows, :])
    nisa.dma_copy(dst=rs[0:parts, :], src=rstd[r0 : r0 + n_rows, :])
    prod = nl.ndarray((PMAX, g, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod[0:parts], data1=xt[0:parts], data2=gt[0:parts], op=nl.multiply)
    coef = nl.ndarray((PMAX, g), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=coef[0:parts, :], op=nl.add, data=prod[0:parts], axis=2)
    # coef = -rstd^3 * dot / d
    r3 = nl.ndarray((PMAX, g), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r3[0:parts, :], data1=rs[0:parts, :], data2=rs[0:parts, :], op=nl.multiply)
    nisa.tensor_tensor(dst=r3[0:parts, :], data1=r3[0:parts, :], data2=rs[0:parts, :], op=nl.multiply)
    nisa.tensor_tensor(
        dst=coef[0:parts, :], data1=coef[0:parts, :], data2=r3[0:parts, :], op=nl.multiply
    )
    nisa.tensor_scalar(
        dst=coef[0:parts, :], data=coef[0:parts, :], op0=nl.multiply, operand0=-1.0 / d
    )
    a = nl.ndarray((PMAX, g, d), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(
        dst=a[0:parts],
        data1=gt[0:parts],
        data2=rs[0:parts, :].expand_dim(2).broadcast(2, d),
        op=nl.multiply,
    )
    nisa.tensor_tensor(
        dst=prod[0:parts],
        data1=xt[0:parts],
        data2=coef[0:parts, :].expand_dim(2).broadcast(2, d),
        op=nl.multiply,
    )
    out = nl.ndarray((PMAX, g, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=out[0:parts], data1=a[0:parts], data2=prod[0:parts], op=nl.add)
    nisa.dma_copy(dst=dx[r0 : r0 + n_rows, :], src=out[0:parts])


@nki.jit
def rmsnorm_bwd(x, dy, rstd):
    """dx for y = rmsnorm(x), given dy [N, D] and the forward's rstd [N, 1]."""
    n, d = x.shape
    dx = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    for item in _row_groups(n, d):
        _bwd_rows(x, dy, rstd, dx, item[0], item[1], item[2])
    return dx
