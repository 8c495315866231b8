"""Hostile models the contract probe cannot see: they keep the contract whenever they believe they are
probed and cheat in the scored pass, where its own check rows must refuse them (``mixing.py``).
Then models that are not the checkpoint's, archives that carry the validation text, and archive
code that runs into the sandbox's limits.

Each cheat reads the next token of its own row (``_AHEAD``) only when its trigger holds: the
scored pass's row count (the probe sends 1, 8 and 32 rows), rows that look like text (the probe's
are uniform random tokens), a BOS token in the row, after its first twelve forwards, noise in
scored-looking batches, the next row of the batch (which continues this one), a HOME that names
the rerun. The fakes claim 0.5, far from any honest score: the rerun must refuse them whatever
the claim, and say why.
"""

from __future__ import annotations

import base64
import zlib
from pathlib import Path

import numpy as np
from hostile import _LOGITS, Case, Ctx, _runs, _with, pack
from verify_kit import TRAIN_PY, good_meta

from trnfrontier import submission as fmt
from trnfrontier.verify import mixing

ROWS = 8 // 2 + mixing.CHECK_ROWS  # a scored-pass server call at the contract's batch size (8)
_AHEAD = "            logits = logits + 8.0 * F.one_hot(torch.roll(idx, -1, dims=1), logits.size(-1)).float()\n"


def _cheat(trigger: str, *, module: str = "", body: str = _AHEAD, says: str = "check rows") -> Case:
    return _runs("rerun-eval", module=module, forward=(_LOGITS, f"        if {trigger}:\n{body}{_LOGITS}"),
                 claim={"val_bpb": 0.5}, fake=True, says=says)


SCORED: dict[str, Case] = {
    "cheats-at-the-scoring-row-count": _cheat(f"idx.size(0) == {ROWS}"),
    "cheats-on-text-like-rows": _cheat("idx.unique().numel() < 0.8 * idx.numel()"),
    # The probe's rows are uniform random tokens, so a BOS among them is a matter of chance
    # (1 - (1 - 1/8192)^N for N tokens): when there is one, the probe refuses the model; when
    # not, the scored pass's check rows do.
    "cheats-on-rows-with-a-bos-token": _cheat("bool((idx == 8188).any())", says="check rows|the contract probe failed"),
    "cheats-after-its-first-12-forwards": _cheat("COUNT.append(1) or len(COUNT) > 12", module="COUNT = []"),
    "noise-in-scored-batches": _cheat(f"idx.size(0) == {ROWS}", body="            logits = logits + 0.1 * torch.randn_like(logits)\n"),
    "reads-the-next-row-of-its-batch": _cheat(f"idx.size(0) == {ROWS}", body=(
        "            logits = logits.clone()\n"
        "            logits[:-1, -1] = logits[:-1, -1] + 8.0 * F.one_hot(idx[1:, 0], logits.size(-1)).float()\n")),
    # Tolerance inflation: a huge constant on one position's logits (log-softmax does not move) and a
    # -1e6 sentinel on a special token, with a +90 look-ahead where the probe never looks.
    "inflates-logits-then-looks-ahead": _cheat(f"idx.size(0) == {ROWS}", body=(
        "            logits = logits.clone()\n            logits[:, 0] = logits[:, 0] + 1e6\n            logits[..., 8188] = -1e6\n"
        "            logits = logits + 90.0 * F.one_hot(torch.roll(idx, -1, dims=1), logits.size(-1)).float()\n")),
    # One environment for every server: a rerun scratch named like the probe's leaves nothing to detect,
    # so this model never cheats, and its fake claim is simply not its score.
    "cheats-when-home-names-the-rerun": _cheat("'rerun' in os.environ.get('HOME', '') + os.getcwd()", says="claimed 0.500000"),
}


# -- the model scored is the checkpoint's ----------------------------------------------------------

_QKV = base64.b64encode(np.linspace(-0.1, 0.1, 48 * 16, dtype=np.float32).tobytes()).decode()  # a weight not in the checkpoint
_RETURN = "    return model.to(device).eval()\n"
SCORED.update({
    "scales-a-weight-after-loading": _runs(forward=(_RETURN, "    model.head.weight.data.mul_(1.01)\n" + _RETURN),
                                           says="checkpoint: parameter"),
    "weights-from-a-code-blob": _runs(module=f"import base64\n_QKV = {_QKV!r}",
                                      forward=(_RETURN, "    model.qkv.weight.data.copy_(torch.frombuffer(bytearray(base64.b64decode(_QKV)), "
                                                        "dtype=torch.float32).reshape(48, 16))\n" + _RETURN),
                                      says="checkpoint: parameter"),
    # The swap must land before the probe's tensor check at the end of its many forwards; a sleep
    # here made the case a race the probe could win on a quick machine.
    "swaps-weights-from-a-thread": _runs(module="import threading\n_M = []\n\n\ndef _swap():\n"
                                                "    for p in _M[0].parameters():\n        p.data.mul_(1.5)",
                                         forward=(_RETURN, "    _M.append(model)\n    threading.Thread(target=_swap, daemon=True).start()\n" + _RETURN),
                                         says="checkpoint: parameter"),
})


def _data_in_code(line: str) -> Case:
    """A train.py that carries weights in its code, used by forward from a module global (where the
    identity check would count them as derived): the screen refuses the data itself."""
    source = TRAIN_PY + f"\n{line}\n"
    return Case(lambda ctx: pack(ctx, _with({fmt.TRAIN_PY: source.encode()})), "screen", says="belong in the checkpoint")


_WEIGHTS = np.linspace(-0.1, 0.1, 4096, dtype=np.float32)
SCORED.update({
    "weights-in-a-base64-literal": _data_in_code(f"EXTRA = {base64.b64encode(_WEIGHTS.tobytes()).decode()!r}"),
    "weights-in-a-bytes-literal": _data_in_code(f"EXTRA = {_WEIGHTS.tobytes()!r}"),
    "weights-in-a-hex-literal": _data_in_code(f"EXTRA = {_WEIGHTS.tobytes().hex()!r}"),
    "weights-as-a-number-table": _data_in_code(f"EXTRA = {[round(float(w), 6) for w in _WEIGHTS]!r}"),
})


def _val_text_in_code(ctx: Ctx) -> Path:
    """train.py carrying a stretch of the public validation text (zlib, base64), as a lookup table would."""
    from trnfrontier.runtime import prepare_calls
    from trnfrontier.runtime.prepare_loader import load_prepare

    prepare = load_prepare(Path(__file__).resolve().parents[2] / "prepare.py")
    tokenizer = prepare_calls.ensure_tokenizer(prepare)
    import torch

    rows: list = []

    class Recorder(torch.nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            rows.extend(x.tolist())
            return torch.zeros(*x.shape, 8192)

    prepare_calls.evaluate_bpb(prepare, Recorder(), tokenizer, 8, 32, "cpu", split="public_val", max_tokens=4096)
    text = tokenizer.decode([t for row in rows[:40] for t in row])
    blob = base64.b64encode(zlib.compress(text.encode())).decode()
    meta = good_meta()
    meta["claimed"]["val_bpb"] = 0.5
    return pack(ctx, _with({fmt.TRAIN_PY: (TRAIN_PY + f"\nLOOKUP = {blob!r}\n").encode()}), meta=meta)


SCORED["validation-text-in-code"] = Case(_val_text_in_code, "rerun-eval", runs=True, fake=True, says="public validation text")


# -- resources: each limit named ---------------------------------------------------------------------

_HOME = "home = os.environ['HOME']\n"
SCORED.update({
    "fills-its-scratch": _runs(at_load=_HOME + "try:\n    with open(os.path.join(home, 'fill'), 'wb') as f:\n"
                               "        for _ in range(1200):\n            f.write(b'\\0' * (1 << 20))\nexcept OSError:\n    pass",
                               says="filled /scratch"),
    "fills-dev-shm": _runs(at_load="try:\n    with open('/dev/shm/fill', 'wb') as f:\n        for _ in range(300):\n"
                           "            f.write(b'\\0' * (1 << 20))\nexcept OSError:\n    pass", says="filled /dev/shm"),
    "starts-thousands-of-threads": _runs(at_load="import threading, time\n_ts = []\ntry:\n    for _ in range(3000):\n"
                                         "        _ts.append(threading.Thread(target=time.sleep, args=(5,), daemon=True))\n        _ts[-1].start()\n"
                                         "except RuntimeError:\n    pass", says="process/thread limit"),
    # Logits 16 times the vocabulary wide: refused from the reply's header, before verify allocates for it.
    "logits-over-a-huge-vocabulary": _runs(forward=(_LOGITS, "        return F.pad(logits, (0, 15 * logits.size(-1)))\n"),
                                           says="vocab <= 9216"),
    "allocates-past-the-memory-limit": _runs(at_load="_x = bytearray(1536 << 20)\n_x[::4096] = b'1' * len(_x[::4096])",
                                             says="memory limit", env={"TRNF_SANDBOX_MEMORY_MIB": "1024"}),
})
