"""`python prepare.py ...` as the organisers run it: eval-public round trip and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TRAIN_PY = '''
import torch
from torch import nn

import prepare  # must be the very prepare.py that runs eval-public

assert prepare.TOKENIZER_VOCAB_SIZE == 8192


class Model(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(vocab))
        self.b = nn.Parameter(torch.zeros(vocab))
        self.c = nn.Parameter(torch.zeros(vocab))

    def forward(self, x):
        return self.a[x].unsqueeze(-1) * self.b + self.c


def load_for_eval(checkpoint_path, device):
    state = torch.load(checkpoint_path, map_location=device)
    model = Model(state["a"].numel())
    model.load_state_dict(state)
    return model.to(device).eval()


if __name__ == "__main__":
    raise SystemExit("train.py's main block must not run during eval-public")
'''


def run_prepare(prepare_module, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(Path(prepare_module.__file__)), *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def test_eval_public_round_trip(prepare_module, sample_home, tiny_models, tmp_path) -> None:
    torch.set_num_threads(1)
    model = tiny_models.RandomLogits(prepare_module.TOKENIZER_VOCAB_SIZE, seed=11)
    checkpoint = tmp_path / "final.pt"
    torch.save({name: p.detach() for name, p in model.named_parameters()}, checkpoint)
    train_py = tmp_path / "train.py"
    train_py.write_text(TRAIN_PY)

    completed = run_prepare(prepare_module, "eval-public", "--train-py", str(train_py), "--checkpoint", str(checkpoint),
                            "--tokens", "1024", "--seq-len", "64", "--batch-size", "3", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    expected = prepare_module.evaluate_bpb(model, prepare_module.ensure_tokenizer(), 5, seq_len=64, max_tokens=1024)
    # Exactly the organisers' seven keys on stdout; what it was scored with goes to stderr.
    assert set(result) == {"val_bpb", "total_nats", "num_tokens", "num_bytes", "eval_seconds", "eval_timeout", "eval_over_timeout"}
    assert result["val_bpb"] == pytest.approx(expected["val_bpb"], rel=1e-12)
    assert result["num_tokens"] == expected["num_tokens"] == 1024 and result["num_bytes"] == expected["num_bytes"]
    assert result["eval_timeout"] == prepare_module.EVAL_TIMEOUT_SECONDS and result["eval_over_timeout"] is False
    from trnfrontier.runtime.prepare_loader import sha256_file

    assert prepare_module.tokenizer_sha256() in completed.stderr
    assert sha256_file(prepare_module.__file__) in completed.stderr


DATACLASS_TRAIN_PY = '''
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Config:
    vocab_size: int


class Model(torch.nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(*idx.shape, -1)


def load_for_eval(checkpoint_path: str, device) -> Model:
    return Model(Config(8192)).to(device).eval()
'''


def test_eval_public_imports_a_future_annotations_dataclass_train_py(prepare_module, sample_home, tmp_path) -> None:
    """A top-level @dataclass under `from __future__ import annotations` needs its module in
    sys.modules while it is created (the real team file and trnf's --single-file archive)."""
    train_py = tmp_path / "train.py"
    train_py.write_text(DATACLASS_TRAIN_PY)
    completed = run_prepare(prepare_module, "eval-public", "--train-py", str(train_py), "--checkpoint", str(train_py),
                            "--tokens", "128", "--seq-len", "32", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["num_tokens"] == 128


@pytest.mark.parametrize(
    "args, message",
    [
        (["setup", "--source", "local", "--path", "/nonexistent/corpus"], "no such file or directory"),
        (["setup", "--source", "local"], "needs --path"),
        (["setup", "--num-train-shards", "0"], "must be at least 1"),
        (["eval-public", "--train-py", "/nonexistent/train.py", "--checkpoint", __file__], "--train-py"),
        (["eval-public", "--train-py", __file__, "--checkpoint", "/nonexistent/final.pt"], "--checkpoint"),
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(prepare_module, tmp_path, args, message) -> None:
    completed = run_prepare(prepare_module, *args, cwd=tmp_path)
    assert completed.returncode != 0
    assert "Traceback" not in completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and completed.stdout == ""


def test_train_py_without_load_for_eval_is_refused(prepare_module, sample_home, tmp_path) -> None:
    train_py = tmp_path / "train.py"
    train_py.write_text("x = 1\n")
    completed = run_prepare(prepare_module, "eval-public", "--train-py", str(train_py), "--checkpoint", str(train_py))
    assert completed.returncode == 1 and "defines no load_for_eval" in completed.stderr


def test_prepare_py_is_standalone(prepare_module) -> None:
    """Only the standard library and the competition's packages, and the heavy ones lazily."""
    import ast

    source = Path(prepare_module.__file__).read_text()
    allowed = set(sys.stdlib_module_names) | {"numpy", "torch", "pyarrow", "tiktoken", "rustbpe"}
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported - {"__future__"} <= allowed, imported - allowed
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import prepare; "
             "print(sorted(m for m in ('torch', 'numpy', 'pyarrow', 'tiktoken', 'rustbpe') if m in sys.modules))")
    completed = subprocess.run([sys.executable, "-c", probe, str(Path(prepare_module.__file__).parent)],
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0 and completed.stdout.strip() == "[]", completed.stderr


def test_print0_prints_on_rank_zero_only(prepare_module, monkeypatch, capsys) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    prepare_module.print0("hidden")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    prepare_module.print0("shown")
    assert capsys.readouterr().out == "shown\n"
