"""Muon's Polar Express orthogonalisation for one matrix: the whole matmul chain on chip.

    X = G / (||G||_F + eps)
    for (a, b, c) in coeffs:  A = X X^T;  B = b A + c A A;  X = a X + B X

G is [m, n] with m <= n (the caller transposes a tall matrix, as the reference does).
X stays resident in SBUF in two layouts, so no step needs a transpose after the first:

    XR [128, MT, n]: row tiles of X (rows of X on partitions)      MT = ceil(m / 128)
    XT [128, NT, m]: row tiles of X^T (columns of X on partitions) NT = ceil(n / 128)

Every product is an ``nc_matmul(stationary[K, M], moving[K, N])`` = stationary^T @ moving
with the contraction K on partitions (<= 128), M <= 128 and N <= 512, accumulated over
K tiles in one PSUM bank:

    A   = X X^T:   stationary XT[:, j, rows_i],  moving XT[:, j, cols]        (sum over j)
    A A = A^T A:   stationary A[:, k, rows_i],   moving A[:, k, cols]         (A symmetric)
    B X = B^T X:   stationary B[:, k, rows_i],   moving XR[:, k, cols]        (B symmetric)
    X^T B:         stationary XR[:, k, rows_j],  moving B[:, k, cols]         (new X^T rows)

The Frobenius norm is a per-partition sum of squares, summed across partitions and
broadcast back to all 128 with two tiny matmuls against a ones vector. Everything fits
in SBUF when 2 * (m * n + n * m) / 128 + 2 * m * m / 128 elements per partition do
(see ``sbuf_bytes``); the runtime falls back to the reference for larger matrices.
Training needs no backward: the optimizer applies this to gradients under no_grad.
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128
NCHUNK = 512  # moving free size / one PSUM bank of float32


def sbuf_bytes(m, n, itemsize):
    """SBUF bytes per partition this kernel allocates for an [m, n] matrix."""
    mt, nt = -(-m // PMAX), -(-n // PMAX)
    resident = 2 * mt * n + 2 * nt * m + 2 * mt * m
    return resident * itemsize + 4 * (PMAX + NCHUNK + 8) + 2 * itemsize * PMAX


def _tiles(size):
    """(tile index, start, rows) of the 128-row tiles covering size rows (static)."""
    return [(i, s, min(PMAX, size - s)) for i, s in enumerate(range(0, size, PMAX))]


def _product(dst, lhs, rhs, out_rows, out_cols, k_size, a_scale, add_src, add_scale):
    """dst[rows_i, i, cols] = a_scale * (lhs^T rhs) [+ add_scale * add_src], tile by tile.

    lhs/rhs/add_src/dst are resident [128, tiles, size] tensors; k runs over lhs's tiles.
    """
    for i, r0, rows in _tiles(out_rows):
        for c0 in nl.static_range(0, out_cols, NCHUNK):
            cols = min(NCHUNK, out_cols - c0)
            acc = nl.ndarray((PMAX, NCHUNK), dtype=nl.float32, buffer=nl.psum)
            for k, _, kk in _tiles(k_size):
                nisa.nc_matmul(
                    dst=acc[0:rows, 0:cols],
                    stationary=lhs[0:kk, k, r0 : r0 + rows],
                    moving=rhs[0:kk, k, c0 : c0 + cols],
                )
            if add_src is None:
                nisa.activation(
                    dst=dst[0:rows, i, c0 : c0 + cols],
                    op=nl.copy,
                    data=acc[0:rows, 0:cols],
                    scale=a_scale,
                )
            else:
                t = nl.ndarray((PMAX, NCHUNK), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(
                    dst=t[0:rows, 0:cols],
                    data=add_src[0:rows, i, c0 : c0 + cols],
                    op0=nl.multiply,
                    operand0=add_scale,
                )
                u = nl.ndarray((PMAX, NCHUNK), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(
                    dst=u[0:rows, 0:cols], op=nl.copy, data=acc[0:rows, 0:cols], scale=a_scale
                )
                nisa.tensor_tensor(
                    dst=dst[0:rows, i, c0 : c0 + cols],
                    data1=t[0:rows, 0:cols],
                    data2=u[0:rows, 0:cols],
                    op=nl.add,
                )


@nki.jit
def polar_express_fwd(g, coeffs, eps):
    """g [m, n] (m <= n) -> the Polar Express iterate after len(coeffs) steps, g's dtype."""
    m, n = g.shape
    dt = g.dtype
    mt, nt = -(-m // PMAX), -(-n // PMAX)
    xr = nl.ndarray((PMAX, mt, n), dtype=dt, buffer=nl.sbuf)
    xr_next = nl.ndarray((PMAX, mt, n), dtype=dt, buffer=nl.sbuf)
    xt = nl.ndarray((PMAX, nt, m), dtype=dt, buffer=nl.sbuf)
    xt_next = nl.ndarray((PMAX, nt, m), dtype=dt, buffer=nl.sbuf)
    a_mat = nl.ndarray((PMAX, mt, m), dtype=dt, buffer=nl.sbuf)
    b_mat = nl.ndarray((PMAX, mt, m), dtype=dt, buffer=nl.sbuf)

    # load X by rows; build X^T with 128x128 Tensor Engine transposes
    for i, r0, rows in _tiles(m):
        nisa.dma_copy(dst=xr[0:rows, i, :], src=g[r0 : r0 + rows, :])
        for j, c0, cols in _tiles(n):
            t_ps = nl.ndarray((PMAX, PMAX), dtype=dt, buffer=nl.psum)
            nisa.nc_transpose(dst=t_ps[0:cols, 0:rows], data=xr[0:rows, i, c0 : c0 + cols])
            nisa.tensor_copy(dst=xt[0:cols, j, r0 : r0 + rows], src=t_ps[0:cols, 0:rows])

    # ||X||_F: per-partition sums of squares, then across partitions with ones-vector matmuls
    ones = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    total_ps = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.psum)
    for i, _r0, rows in _tiles(m):
        acc = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc[0:rows, :], value=0.0)
        for c0 in nl.static_range(0, n, NCHUNK):
            cols = min(NCHUNK, n - c0)
            sq = nl.ndarray((PMAX, NCHUNK), dtype=nl.float32, buffer=nl.sbuf)
            part = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation_reduce(
                dst=sq[0:rows, 0:cols],
                op=nl.square,
                data=xr[0:rows, i, c0 : c0 + cols],
                reduce_op=nl.add,
                reduce_res=part[0:rows, :],
            )
            nisa.tensor_tensor(
                dst=acc[0:rows, :], data1=acc[0:rows, :], data2=part[0:rows, :], op=nl.add
            )
        nisa.nc_matmul(dst=total_ps, stationary=ones[0:rows, 0:1], moving=acc[0:rows, :])
    total = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=total, src=total_ps)
    bcast_ps = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=bcast_ps, stationary=ones[0:1, :], moving=total)
    inv = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=inv, op=nl.sqrt, data=bcast_ps)
    nisa.tensor_scalar(dst=inv, data=inv, op0=nl.add, operand0=eps)
    nisa.reciprocal(dst=inv, data=inv)
    for i, _r0, rows in _tiles(m):
        nisa.tensor_scalar(
            dst=xr[0:rows, i, :], data=xr[0:rows, i, :], op0=nl.multiply, operand0=inv[0:rows, :]
        )
    for j, _c0, cols in _tiles(n):
        nisa.tensor_scalar(
            dst=xt[0:cols, j, :], data=xt[0:cols, j, :], op0=nl.multiply, operand0=inv[0:cols, :]
        )

    for a, b, c in coeffs:  # static: a handful of steps, each a fixed matmul chain
        _product(a_mat, xt, xt, m, m, n, 1.0, None, 0.0)  # A = X X^T
        _product(b_mat, a_mat, a_mat, m, m, m, c, a_mat, b)  # B = b A + c A A
        _product(xr_next, b_mat, xr, m, n, m, 1.0, xr, a)  # X' = a X + B X
        _product(xt_next, xr, b_mat, n, m, m, 1.0, xt, a)  # X'^T = a X^T + X^T B
        xr, xr_next = xr_next, xr
        xt, xt_next = xt_next, xt

    out = nl.ndarray((m, n), dtype=dt, buffer=nl.shared_hbm)
    for i, r0, rows in _tiles(m):
        nisa.dma_copy(dst=out[r0 : r0 + rows, :], src=xr[0:rows, i, :])
    return out
