"""Fused relu(x)^2 (the MLP activation), forward and backward.

Layout: x is [N, D] in HBM (callers flatten leading dimensions). Rows go to the 128
partitions, columns are walked in chunks of FREE_CHUNK. Full row tiles run in an
``affine_range`` loop and a ragged last tile (N % 128 rows) is handled once after it,
so every tile size is a compile-time constant.
"""

import nki
import nki.isa as nisa
import nki.language as nl

PMAX = 128  # partitions per tile (nl.tile_size.pmax on Trn2)
FREE_CHUNK = 2048  # columns per tile: 8 KiB per partition in float32


def _share(n_items):
    """(first, count): this program's contiguous share of n_items under the launch grid."""
    pid, nprog = nl.program_id(0), nl.num_programs(0)
    base, extra = n_items // nprog, n_items % nprog
    return pid * base + min(pid, extra), base + (1 if pid < extra else 0)


def _last_program():
    """The program that takes the ragged tail tile (the only one without a grid)."""
    return nl.program_id(0) == nl.num_programs(0) - 1


def _fwd_tile(x, y, r0, rows):
    d = x.shape[1]
    for c0 in nl.static_range(0, d, FREE_CHUNK):
        cols = min(FREE_CHUNK, d - c0)
        xt = nl.ndarray((PMAX, FREE_CHUNK), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:rows, 0:cols], src=x[r0 : r0 + rows, c0 : c0 + cols])
        r = nl.ndarray((PMAX, FREE_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r[0:rows, 0:cols], op=nl.relu, data=xt[0:rows, 0:cols])
        yt = nl.ndarray((PMAX, FREE_CHUNK), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=yt[0:rows, 0:cols], op=nl.square, data=r[0:rows, 0:cols])
        nisa.dma_copy(dst=y[r0 : r0 + rows, c0 : c0 + cols], src=yt[0:rows, 0:cols])


@nki.jit
def relu2_fwd(x):
    """y = relu(x)^2, same shape and dtype as x [N, D]."""
    n, d = x.shape
    y = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    first, count = _share(n // PMAX)
    for j in nl.affine_range(count):
        _fwd_tile(x, y, (first + j) * PMAX, PMAX)
    if n % PMAX and _last_program():
        _fwd_tile(x, y, n - n % PMAX, n % PMAX)
    return y


def _bwd_tile(x, dy, dx, r0, rows):
    d = x.shape[1]
    for c0 in nl.static_range(0, d, FREE_CHUNK):
        cols = min(FREE_CHUNK, d - c0)
        xt = nl.ndarray((PMAX, FREE_CHUNK), dtype=x.dtype, buffer=nl.sbuf)
        gt = nl.ndarray((PMAX, FREE_CHUNK), dtype=dy.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:rows, 0:cols], src=x[r0 : r0 + rows, c0 : c0 + cols])
        nisa.dma_copy(dst=gt[0:rows, 0:cols], src=dy[r0 : r0 + rows, c0 : c0 + cols])
        # relu(2x) == 2 relu(x): the factor 2 rides on the activation's free input scale
        r = nl.ndarray((PMAX, FREE_CHUNK), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=r[0:rows, 0:cols], op=nl.relu, data=xt[0:rows, 0:cols], scale=2.0)
        out = nl.ndarray((PMAX, FREE_CHUNK), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(
            dst=out[0:rows, 0:cols],
            data1=r[0:rows, 0:cols],
            data2=gt[0:rows, 0:cols],
            op=nl.multiply,
        )
        nisa.dma_copy(dst=dx[r0 : r0 + rows, c0 : c0 + cols], src=out[0:rows, 0:cols])


@nki.jit
def relu2_bwd(x, dy):
    """dx = 2 relu(x) dy for x, dy [N, D]."""
    n, d = x.shape
    dx = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    first, count = _share(n // PMAX)
    for j in nl.affine_range(count):
        _bwd_tile(x, dy, dx, (first + j) * PMAX, PMAX)
    if n % PMAX and _last_program():
        _bwd_tile(x, dy, dx, n - n % PMAX, n % PMAX)
    return dx
