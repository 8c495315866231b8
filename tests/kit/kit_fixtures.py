"""Kit-style train.py files for the kit-mode tests, written the way a team writes one.

``write_train_py(directory, mode)`` writes ``directory/train.py``: a tiny causal model
trained through the prepare.py API (``ensure_tokenizer``, ``make_dataloader``,
``get_dist_info``, ``record_step_boundary``, ``evaluate_bpb``), DDP over gloo when
torchrun starts several ranks, ``TRNF_DRY_RUN_STEPS`` (else ``--steps``, default 8)
steps, ``out/final.pt`` in the kit layout, and ``load_for_eval``. ``mode`` spoils it:

- ``good``: as above.
- ``crash``: rank 1 raises at step index 1, its second (rank 0 is then stuck in the next all-reduce).
- ``hang``: every rank writes ``pids/rank<R>`` (its pid and a ``sleep`` child's pid),
  then the last rank sleeps forever and the others wait for it in a barrier.
- ``nan``: the loss becomes NaN from step index 2.
- ``nolog``: never calls record_step_boundary.
- ``exitabort``: rank 1 finishes, then aborts while Python shuts down, printing what
  torch's gloo backend prints when it does so (see ``kit.logs.aborted_after_finishing``).
- ``overbudget``: after its steps, rank 0 appends one more boundary 3,000 s in the future
  to the step log, as if the run had taken that long.

``run_cli(args, capsys)`` runs `trnf` in this process and returns (code, stdout, stderr);
``pid_alive(pid)`` reads /proc.
"""

from __future__ import annotations

from pathlib import Path

from tests.cli_run import run_cli  # noqa: F401  (the kit tests import it from here)

MODES = ("good", "crash", "hang", "nan", "nolog", "overbudget", "exitabort")

TEMPLATE = '''\
"""A kit-style train.py (the organisers' layout), written by trnf's tests."""
import argparse
import os
{extra_imports}
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from prepare import ensure_tokenizer, evaluate_bpb, get_dist_info, make_dataloader, record_step_boundary

MODE = "{mode}"
CONFIG = {{"vocab_size": 8192, "n_embd": 16}}
SEQ_LEN = 32


class TinyLM(nn.Module):
    def __init__(self, vocab_size, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.mix = nn.Linear(n_embd, n_embd, bias=False)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx):
        h = self.wte(idx)
        # Causal by construction: position t sees the mean of positions <= t.
        h = torch.cumsum(h, dim=1) / torch.arange(1, idx.size(1) + 1, device=idx.device).view(1, -1, 1)
        h = h + self.mix(h)
        return self.head(F.rms_norm(h, (h.size(-1),)))


def load_for_eval(checkpoint_path, device):
    data = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    model = TinyLM(**data["model_config"])
    model.load_state_dict(data["model_state"])
    return model.to(device).eval()


{hang}def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    steps = int(os.environ.get("TRNF_DRY_RUN_STEPS", args.steps))
    torch.set_num_threads(1)
    is_ddp, rank, _, world = get_dist_info()
    if is_ddp:
        dist.init_process_group(os.environ.get("TRNF_DIST_BACKEND", "gloo"))
{call_hang}    torch.manual_seed(0)
    model = TinyLM(**CONFIG)
    train_model = nn.parallel.DistributedDataParallel(model) if is_ddp else model
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokenizer = ensure_tokenizer()
    loader = make_dataloader(tokenizer, 4, SEQ_LEN, "train")
    print(f"rank {{rank}}/{{world}}: {{sum(p.numel() for p in model.parameters()):,}} parameters", flush=True)
    for step in range(steps):  # 0-based, as the kit counts (and prints) its steps
        x, y, _ = next(loader)
        loss = F.cross_entropy(train_model(x).flatten(0, 1), y.flatten())
        if MODE == "nan" and step >= 2:
            loss = loss * float("nan")
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        if MODE == "crash" and rank == 1 and step == 1:
            raise RuntimeError("injected failure on rank 1 at step 2")
        if MODE != "nolog":
            record_step_boundary(step)  # the kit passes the 0-based index
        print(f"step {{step}} | loss {{loss.item():.4f}} | lr 0.003 | rank {{rank}}", flush=True)
    if MODE == "overbudget" and rank == 0:
        import json, time
        with open(os.environ["TRNF_STEP_LOG"], "a") as handle:
            handle.write(json.dumps({{"step": steps, "time": time.time() + 3000}}) + "\\n")
    if rank == 0:
        os.makedirs("out", exist_ok=True)
        torch.save({{"model_state": model.state_dict(), "model_config": CONFIG, "meta": {{"steps": steps}}}}, "out/final.pt")
    result = evaluate_bpb(model.eval(), tokenizer, 2, seq_len=SEQ_LEN, max_tokens=256)  # every rank: it all-reduces
    if rank == 0:
        print(f"step {{steps - 1}} | val_bpb {{result['val_bpb']:.4f}}", flush=True)
    if is_ddp:
        dist.destroy_process_group()
    if MODE == "exitabort" and rank == 1:
        import atexit
        import sys
        sys.stderr.write("terminate called without an active exception\\n")
        atexit.register(os.abort)  # runs after the script, with no Python frame left


if __name__ == "__main__":
    main()
'''


# Only the hanging script starts a process: the others must pass `trnf verify`'s static
# screen, which refuses subprocess.
HANG = '''def hang(rank, world):
    child = subprocess.Popen(["sleep", "600"])
    os.makedirs("pids", exist_ok=True)
    with open(f"pids/rank{rank}", "w") as handle:
        handle.write(f"{os.getpid()} {child.pid}")
    if rank == world - 1:
        time.sleep(3600)
    dist.barrier()


'''


def train_py_source(mode: str = "good") -> str:
    if mode not in MODES:
        raise ValueError(f"unknown fixture mode {mode!r}; one of {MODES}")
    hang = mode == "hang"
    return TEMPLATE.format(
        mode=mode,
        extra_imports="import subprocess\nimport time\n" if hang else "",
        hang=HANG if hang else "",
        call_hang="    hang(rank, world)\n" if hang else "",
    )


def write_train_py(directory: Path, mode: str = "good") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "train.py"
    path.write_text(train_py_source(mode), encoding="utf-8")
    return path


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (read from /proc here, independently of trnf's own process code);
    a zombie (dead, not yet reaped by its new parent) counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
