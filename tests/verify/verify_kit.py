"""Builders for submission archives in tests: a tiny self-contained valid submission, and ways to spoil it."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trnfrontier import submission as fmt

PREPARE_SHA = hashlib.sha256(b"test prepare.py").hexdigest()
TOKENIZER_SHA = hashlib.sha256(b"test tokenizer").hexdigest()
LAUNCH = "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=1 train.py"
# The settings good_meta's claim was measured at: what a --rerun-eval of these archives scores.
RERUN = {"eval_tokens": 4096, "eval_seq_len": 32}

# A small causal model, load_for_eval from safetensors (read without the safetensors
# package, which the organisers' environment does not promise), and a training loop that
# honours TRNF_DRY_RUN_STEPS / TRNF_DIST_BACKEND. MODE spoils the model for contract tests.
TRAIN_PY = '''\
"""Tiny self-contained submission used by the verify tests."""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

MODE = "good"
CONFIG = {"vocab_size": 8192, "n_embd": 16, "seq_len": 32}


class TinyGPT(nn.Module):
    def __init__(self, vocab_size, n_embd, seq_len):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx):
        h = self.wte(idx)
        if MODE == "peek":
            h = h + self.wte(torch.roll(idx, -1, dims=1))
        q, k, v = self.qkv(h).unsqueeze(1).chunk(3, dim=-1)
        h = h + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1))
        if MODE == "batch":
            h = h - h.mean(dim=0, keepdim=True)
        logits = self.head(F.rms_norm(h, (h.size(-1),)))
        if MODE == "noise":
            logits = logits + torch.randn_like(logits)
        return logits


def save_safetensors(state, path):
    header, blobs, offset = {}, [], 0
    for name in sorted(state):
        data = state[name].detach().cpu().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(state[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for blob in blobs:
            handle.write(blob)


def load_safetensors(path):
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
        data = handle.read()
    state = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        state[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32).reshape(info["shape"])
    return state


def load_for_eval(checkpoint_path, device):
    model = TinyGPT(**CONFIG)
    model.load_state_dict(load_safetensors(os.path.join(os.path.dirname(checkpoint_path), "model.safetensors")))
    if MODE == "hook":
        model.head.register_forward_hook(lambda module, args, output: None)
    return model.to(device).eval()


def main():
    import prepare

    steps = int(os.environ.get("TRNF_DRY_RUN_STEPS", "50"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.distributed.init_process_group(os.environ.get("TRNF_DIST_BACKEND", "gloo"))
    torch.manual_seed(0)
    model = TinyGPT(**CONFIG)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = torch.randint(0, CONFIG["vocab_size"], (2, CONFIG["seq_len"] + 1), generator=gen)
        loss = F.cross_entropy(ddp(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        optim.zero_grad()
        loss.backward()
        optim.step()
        prepare.record_step_boundary(step)
        print(f"step {step} loss {loss.item():.3f}", flush=True)
    if rank == 0:
        os.makedirs("out", exist_ok=True)
        save_safetensors(model.state_dict(), "out/model.safetensors")
        torch.save({"model_state": model.state_dict(), "model_config": CONFIG, "meta": {"steps": steps}}, "out/final.pt")
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def train_source(n_embd: int = 16, mode: str = "good") -> str:
    """TRAIN_PY for a model of width ``n_embd``, spoiled by ``mode`` (peek, batch, noise, hook)."""
    return TRAIN_PY.replace('"n_embd": 16', f'"n_embd": {n_embd}').replace('MODE = "good"', f'MODE = "{mode}"')


def tiny_state(seed: int = 0, n_embd: int = 16) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    v, d = 8192, n_embd
    return {
        "wte.weight": torch.randn(v, d) * 0.02,
        "qkv.weight": torch.randn(3 * d, d) * 0.1,
        "proj.weight": torch.randn(d, d) * 0.1,
        "head.weight": torch.randn(v, d) * 0.02,
    }


def step_log(times: list[float], start: float = 1000.0) -> str:
    """prepare.record_step_boundary's format: a header with the process start, then boundaries."""
    lines = [{"header": True, "start_time": start, "pid": 1}] + [{"step": i, "time": start + t} for i, t in enumerate(times)]
    return "".join(json.dumps(line) + "\n" for line in lines)


# 60 s of startup (excluded), then 10 s a step: about 550 s charged.
GOOD_TIMES = [20.0, 30.0, 40.0, 50.0, 60.0] + [60.0 + 10 * i for i in range(1, 56)]


def write_files(dest: Path, *, state: dict[str, torch.Tensor] | None = None, train_py: str = TRAIN_PY,
                launch: str = LAUNCH, times: list[float] | None = None, final_pt: Any = None,
                extra: dict[str, bytes] | None = None) -> dict[str, Path]:
    """Write the members of a valid submission under ``dest``; returns member name -> path."""
    from safetensors.torch import save_file

    state = tiny_state() if state is None else state
    files: dict[str, bytes | None] = {
        fmt.TRAIN_PY: train_py.encode(),
        fmt.LAUNCH_FILE: (launch + "\n").encode(),
        fmt.CHECKPOINT_META: json.dumps({"model_config": {"vocab_size": 8192, "n_embd": 16}}).encode(),
        fmt.WRITEUP: b"# Tiny test submission\n",
        fmt.METRICS_LOG: b'{"step": 1, "loss": 9.0}\n',
        fmt.SUMMARY: json.dumps({"val_bpb": 12.0}).encode(),
        fmt.STEP_LOG: step_log(GOOD_TIMES if times is None else times).encode(),
        fmt.CHECKPOINT_SAFETENSORS: None,
        fmt.CHECKPOINT_FINAL_PT: None,
        **(extra or {}),
    }
    out: dict[str, Path] = {}
    for name, data in files.items():
        path = fmt.member_path(dest, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if name == fmt.CHECKPOINT_SAFETENSORS:
            save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        elif name == fmt.CHECKPOINT_FINAL_PT:
            payload = final_pt if final_pt is not None else {"model_state": state, "model_config": {"vocab_size": 8192}, "meta": {}}
            torch.save(payload, path)
        else:
            path.write_bytes(data)  # type: ignore[arg-type]
        out[name] = path
    return out


def good_meta(state: dict[str, torch.Tensor] | None = None, launch: str = LAUNCH) -> dict[str, Any]:
    state = tiny_state() if state is None else state
    return {
        "prepare_sha256": PREPARE_SHA,
        "tokenizer_sha256": TOKENIZER_SHA,
        "claimed": {"val_bpb": 12.0, "eval_tokens": 4096, "eval_seq_len": 32, "split": "public_val", "measured_by": "test"},
        "params": sum(t.numel() for t in state.values()),
        "versions": {"python": "3.11", "torch": torch.__version__, "torch_neuronx": None, "trnf": "0.1.0"},
        "git": {"commit": None, "dirty": None},
        "seed": 0,
        "launch": launch,
        "forced": [],
    }


def build_archive(workdir: Path, name: str = "submission.tar", *,
                  edit_manifest: Callable[[dict[str, Any]], None] | None = None,
                  meta: dict[str, Any] | None = None, unlisted: dict[str, bytes] | None = None,
                  **file_kwargs: Any) -> Path:
    """A submission archive built the way `trnf package` will (build_manifest + write_deterministic_tar)."""
    src = workdir / (name + ".src")
    files = write_files(src, **file_kwargs)
    manifest = fmt.build_manifest(files, **(meta if meta is not None else good_meta(file_kwargs.get("state"), file_kwargs.get("launch", LAUNCH))))
    if edit_manifest:
        edit_manifest(manifest)
    members: dict[str, Path | bytes] = dict(files)
    members[fmt.MANIFEST] = fmt.manifest_bytes(manifest)
    members.update(unlisted or {})
    out = workdir / name
    fmt.write_deterministic_tar(members, out)
    return out


def raw_tar(path: Path, entries: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w") -> Path:
    """A tar written member by member, bypassing every safety of the normal builder."""
    with tarfile.open(path, mode, format=tarfile.GNU_FORMAT) as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def pins_file(workdir: Path, prepare: str = PREPARE_SHA, tokenizer: str = TOKENIZER_SHA) -> Path:
    path = workdir / "pins.json"
    path.write_text(json.dumps({"prepare_sha256": prepare, "tokenizer_sha256": tokenizer}))
    return path
