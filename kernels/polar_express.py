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

The kernel takes a batch g [B, m, n] of same-shaped matrices (Muon's parameter groups)
and splits the batch between the programs of the LNC launch grid (``kernel[2]``): the
matrix chain of one matrix stays on one physical core, each core takes its share of
matrices. A zero matrix (Muon's first step for a zero-initialised projection) has
||G||_F = 0; sqrt(0) is outside the Scalar Engine's valid input range, so the sum of
squares is floored at SQRT_MIN first and the result is exactly 0, as the reference's.
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128
NCHUNK = 512  # moving free size / one PSUM bank of float32
SQRT_MIN = 2.0**-116  # smallest valid nl.sqrt input on the Scalar Engine


def _share(n_items):
    """(first, count): this program's contiguous share of n_items under the launch grid."""
    pid, nprog = nl.program_id(0), nl.num_programs(0)
    base, extra = n_items // nprog, n_items % nprog
    return pid * base + min(pid, extra), base + (1 if pid < extra else 0)


def sbuf_bytes(m, n, itemsize):
    """SBUF bytes per partition this kernel allocates for an [m, n] matrix."""
    mt, nt = -(-m // PMAX), -(-n // PMAX)
    resident = 2 * mt * n + 2 * nt * m + 2 * mt * m
    return resident * itemsize + 4 * (PMAX + NCHUNK + 8) + 2 * itemsize * PMAX


def _product(dst, lhs, rhs, out_rows, out_cols, k_size, a_scale, add_src, add_scale):
    """dst[rows_i, i, cols] = a_scale * (lhs^T rhs) [+ add_scale * add_src], tile by tile.

    lhs/rhs/add_src/dst are resident [128, tiles, size] tensors; k runs over lhs's tiles.
    """
    for i in nl.static_range(-(-out_rows // PMAX)):
        r0 = i * PMAX
        rows = min(PMAX, out_rows - r0)
        for c0 in nl.static_range(0, out_cols, NCHUNK):
            cols = min(NCHUNK, out_cols - c0)
            acc = nl.ndarray((PMAX, NCHUNK), dtype=nl.float32, buffer=nl.psum)
            for k in nl.static_range(-(-k_size // PMAX)):
                kk = min(PMAX, k_size - k * PMAX)
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
    """g [B, m, n] (m <= n) -> each matrix's Polar Express iterate after len(coeffs) steps,
    g's dtype; the programs of the launch grid split the batch."""
    bsz, m, n = g.shape
    out = nl.ndarray((bsz, m, n), dtype=g.dtype, buffer=nl.shared_hbm)
    first, count = _share(bsz)
    for j in nl.affine_range(count):
        _one_matrix(g, out, first + j, coeffs, eps)
    return out


def _load(g, b, xr, xt, m, n):
    """X by rows into xr; X^T into xt with 128x128 Tensor Engine transposes."""
    dt = g.dtype
    for i in nl.static_range(-(-m // PMAX)):
        r0 = i * PMAX
        rows = min(PMAX, m - r0)
        nisa.dma_copy(dst=xr[0:rows, i, :], src=g[b, r0 : r0 + rows, :])
        for j in nl.static_range(-(-n // PMAX)):
            c0 = j * PMAX
            cols = min(PMAX, n - c0)
            t_ps = nl.ndarray((PMAX, PMAX), dtype=dt, buffer=nl.psum)
            nisa.nc_transpose(dst=t_ps[0:cols, 0:rows], data=xr[0:rows, i, c0 : c0 + cols])
            nisa.tensor_copy(dst=xt[0:cols, j, r0 : r0 + rows], src=t_ps[0:cols, 0:rows])


def _inverse_norm(xr, m, n, eps):
    """[128, 1] float32 tile holding 1 / (||X||_F + eps) on every partition."""
    ones = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    total_ps = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.psum)
    for i in nl.static_range(-(-m // PMAX)):
        rows = min(PMAX, m - i * PMAX)
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
    # floor at the smallest valid sqrt input: a zero matrix gives sqrt(2^-116) + eps ~ eps
    nisa.tensor_scalar(dst=inv, data=bcast_ps, op0=nl.maximum, operand0=SQRT_MIN)
    nisa.activation(dst=inv, op=nl.sqrt, data=inv)
    nisa.tensor_scalar(dst=inv, data=inv, op0=nl.add, operand0=eps)
    nisa.reciprocal(dst=inv, data=inv)
    return inv


def _one_matrix(g, out, b, coeffs, eps):
    _, m, n = g.shape
    dt = g.dtype
    mt, nt = -(-m // PMAX), -(-n // PMAX)
    xr = nl.ndarray((PMAX, mt, n), dtype=dt, buffer=nl.sbuf)
    xr_next = nl.ndarray((PMAX, mt, n), dtype=dt, buffer=nl.sbuf)
    xt = nl.ndarray((PMAX, nt, m), dtype=dt, buffer=nl.sbuf)
    xt_next = nl.ndarray((PMAX, nt, m), dtype=dt, buffer=nl.sbuf)
    a_mat = nl.ndarray((PMAX, mt, m), dtype=dt, buffer=nl.sbuf)
    b_mat = nl.ndarray((PMAX, mt, m), dtype=dt, buffer=nl.sbuf)
    _load(g, b, xr, xt, m, n)
    inv = _inverse_norm(xr, m, n, eps)
    for i in nl.static_range(mt):
        rows = min(PMAX, m - i * PMAX)
        nisa.tensor_scalar(
            dst=xr[0:rows, i, :], data=xr[0:rows, i, :], op0=nl.multiply, operand0=inv[0:rows, :]
        )
    for j in nl.static_range(nt):
        cols = min(PMAX, n - j * PMAX)
        nisa.tensor_scalar(
            dst=xt[0:cols, j, :], data=xt[0:cols, j, :], op0=nl.multiply, operand0=inv[0:cols, :]
        )

    for abc in coeffs:  # static: a handful of steps, each a fixed matmul chain
        a, bb, c = abc[0], abc[1], abc[2]
        _product(a_mat, xt, xt, m, m, n, 1.0, None, 0.0)  # A = X X^T
        _product(b_mat, a_mat, a_mat, m, m, m, c, a_mat, bb)  # B = b A + c A A
        _product(xr_next, b_mat, xr, m, n, m, 1.0, xr, a)  # X' = a X + B X
        _product(xt_next, xr, b_mat, n, m, m, 1.0, xt, a)  # X'^T = a X^T + X^T B
        xr, xr_next = xr_next, xr
        xt, xt_next = xt_next, xt

    for i in nl.static_range(mt):
        r0 = i * PMAX
        rows = min(PMAX, m - r0)
        nisa.dma_copy(dst=out[b, r0 : r0 + rows, :], src=xr[0:rows, i, :])
