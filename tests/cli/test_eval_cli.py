"""`trnf eval`: the scorer's number in a fresh process, checks that invalidate a score, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path
from textwrap import dedent

import pytest
import torch

from tests.cli_run import run_cli
from trnfrontier.runtime.integrity import write_manifest

torch.set_num_threads(1)

# Small enough for a shared 2-core machine: 4,096 tokens at context 64.
FAST = ["--tokens", "4096", "--seq-len", "64", "--batch-size", "8", "--device", "cpu"]


def _current_shas() -> tuple[str, str]:
    from trnfrontier.trusted_prepare import load_contract

    contract = load_contract()
    return contract.sha256, contract.module.ensure_tokenizer().sha256


def _save_run(run: Path, head_std: float, meta: dict | None = None, seed: int = 0) -> Path:
    """A run directory with a final checkpoint of a tiny GPT (the head's scale sets its score)."""
    from trnfrontier.runtime.checkpoint import save_final
    from trnfrontier.runtime.model import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=8192, sequence_len=64, n_layer=1, n_head=2, n_kv_head=1, n_embd=32))
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, head_std)
    prepare_sha, tokenizer_sha = _current_shas()
    save_final(run, model, {"prepare_sha256": prepare_sha, "tokenizer_sha256": tokenizer_sha, **(meta or {})})
    return run


KIT_MODELS = {
    "causal": "return logits",
    # Reads the next token: the textbook causality bug.
    "peeking": "return self.table[torch.roll(idx, shifts=-1, dims=1)]",
    # Causal, but each row is shifted by the batch mean: depends on the other rows.
    "row_mixing": "return logits + logits.mean(dim=0, keepdim=True)",
}


def _kit_train_py(directory: Path, body: str = KIT_MODELS["causal"], extra: str = "") -> Path:
    """A kit-style train.py whose load_for_eval returns a per-token lookup-table model."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "train.py"
    path.write_text(
        dedent(
            f"""
            import torch
            import prepare  # the trusted module the evaluator loaded

            print("train.py chatter on stdout must not break the JSON channel")

            class Lookup(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    g = torch.Generator().manual_seed(0)
                    self.table = torch.nn.Parameter(torch.randn(prepare.TOKENIZER_VOCAB_SIZE, prepare.TOKENIZER_VOCAB_SIZE, generator=g))

                def forward(self, idx):
                    logits = self.table[idx]
                    {body}

            def load_for_eval(checkpoint_path, device):
                return Lookup().to(device).eval()

            if __name__ == "__main__":
                raise SystemExit("the evaluator must not run __main__")
            """
        )
        + extra
    )
    (directory / "final.pt").write_bytes(b"unused by this loader")
    return path


@pytest.mark.slow
def test_final_checkpoint_scores_match_and_sort(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _save_run(tmp_path / "good", head_std=0.0)  # uniform logits
    worse = _save_run(tmp_path / "worse", head_std=0.5)
    worst = _save_run(tmp_path / "worst", head_std=2.0)
    code, out, err = run_cli(["eval", str(worst), str(good / "final" / "final.pt"), str(worse), "--json", *FAST], capsys)
    assert code == 0, err
    document = json.loads(out)
    results = document["results"]
    assert [Path(r["path"]).parts[-3 if r["path"].endswith(".pt") else -1] for r in results] == ["good", "worse", "worst"]
    values = [r["val_bpb"] for r in results]
    assert values == sorted(values) and values[0] < values[1] < values[2]
    assert [r["delta_to_best"] for r in results] == [v - values[0] for v in values]
    assert document["best"] == results[0]["path"] and document["all_valid"]
    # Uniform logits over 8,192 tokens: exactly log2(8192) bits per non-special token.
    first = results[0]
    # num_tokens counts every target (the kit's meaning); the nats only byte-bearing ones.
    counted = first["total_nats"] / math.log(8192)
    assert abs(counted - round(counted)) < 1e-3 and round(counted) <= first["num_tokens"]
    assert math.isclose(first["val_bpb"], 13 * round(counted) / first["num_bytes"], rel_tol=1e-6)
    for r in results:
        assert r["causality"]["passed"] and r["batch_independence"]["passed"]
        assert len(r["prepare_sha256"]) == 64 and len(r["tokenizer_sha256"]) == 64
        assert r["num_tokens"] > 0 and r["params"] > 0 and r["seq_len"] == 64


def test_table_is_sorted_with_short_hashes_and_failures_last(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    better = _save_run(tmp_path / "better", head_std=0.0)
    poorer = _save_run(tmp_path / "poorer", head_std=1.0)
    damaged = _save_run(tmp_path / "damaged", head_std=0.5)
    (damaged / "final" / "meta.json").write_text("{}")
    code, out, err = run_cli(["eval", str(damaged), str(poorer), str(better), *FAST], capsys)
    assert code == 1  # one checkpoint failed; the others are still scored and ranked
    assert out.index(str(better)) < out.index(str(poorer)) < out.index(str(damaged))
    assert "ERROR" in out and "meta.json is damaged" in err and "Traceback" not in err
    prepare_sha, tokenizer_sha = _current_shas()
    assert prepare_sha[:12] in out and prepare_sha not in out
    assert tokenizer_sha[:12] in out
    assert "+0.000000" in out


@pytest.mark.parametrize("kind", ["peeking", "row_mixing"])
def test_a_model_failing_a_check_is_invalid_loudly(kind: str, sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = _kit_train_py(tmp_path / kind, KIT_MODELS[kind])
    code, out, err = run_cli(["eval", "--train-py", str(train_py), "--checkpoint", str(train_py.parent / "final.pt"), *FAST], capsys)
    assert code == 1
    assert "INVALID" in out and "INVALID" in err
    check = "causality" if kind == "peeking" else "batch"
    assert f"NO: {check}" in out


def test_kit_train_py_is_loaded_without_main_and_scored(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = _kit_train_py(tmp_path / "kit")
    code, out, err = run_cli(["eval", "--train-py", str(train_py), "--checkpoint", str(train_py.parent / "final.pt"), "--json", *FAST], capsys)
    assert code == 0, err
    (result,) = json.loads(out)["results"]
    assert result["status"] == "ok" and result["causality"]["passed"] and result["batch_independence"]["passed"]
    assert result["val_bpb"] > 0


def test_non_causal_json_is_marked_invalid(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = _kit_train_py(tmp_path / "peek", KIT_MODELS["peeking"])
    code, out, _ = run_cli(["eval", "--train-py", str(train_py), "--checkpoint", str(train_py.parent / "final.pt"), "--json", *FAST], capsys)
    assert code == 1
    document = json.loads(out)
    (peek,) = document["results"]
    assert peek["status"] == "invalid" and not peek["causality"]["passed"] and peek["causality"]["max_abs_diff"] > 0
    assert peek["batch_independence"]["passed"]  # the lookup is per row: only causality fails
    assert document["best"] is None and not document["all_valid"]


def test_sample_generates_greedy_and_temperature_text(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _save_run(tmp_path / "run", head_std=0.5)
    code, out, _ = run_cli(["eval", str(run), "--json", "--sample", "5", "--prompt", "The king", *FAST], capsys)
    assert code == 0
    samples = json.loads(out)["results"][0]["samples"]
    assert [s["temperature"] for s in samples] == [0.0, 0.8]
    assert all(isinstance(s["text"], str) and s["text"] for s in samples)


def test_sha_mismatch_is_refused_unless_allowed(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _save_run(tmp_path / "run", head_std=0.0)
    meta_path = run / "final" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["tokenizer_sha256"] = "0" * 64
    meta_path.write_text(json.dumps(meta))
    write_manifest(meta_path.parent)  # a consistent edit, not damage: the SHA check must catch it
    code, out, err = run_cli(["eval", str(run), *FAST], capsys)
    lines = [line for line in err.splitlines() if line.startswith("trnf:")]
    assert code == 1 and out == ""
    assert len(lines) == 1 and "tokenizer SHA256" in lines[0] and "prepare.py SHA256" not in lines[0]
    assert "--allow-mismatch" in lines[0] and "Traceback" not in err
    code, out, _ = run_cli(["eval", str(run), "--allow-mismatch", "--json", *FAST], capsys)
    assert code == 0
    assert json.loads(out)["results"][0]["mismatches"]


def _bad_input_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    from trnfrontier.runtime.model import GPT, GPTConfig

    pickled = tmp_path / "pickled" / "final.pt"
    pickled.parent.mkdir()
    torch.save(GPT(GPTConfig(vocab_size=256, sequence_len=16, n_layer=1, n_head=1, n_kv_head=1, n_embd=16)), pickled)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00not a checkpoint")
    no_loader = tmp_path / "no_loader" / "train.py"
    no_loader.parent.mkdir()
    no_loader.write_text("import torch\n")
    text = tmp_path / "text" / "final.pt"
    text.parent.mkdir()
    text.write_text("not a checkpoint\n")
    return {
        "pickled": ([str(pickled)], "pickled Python objects"),
        "garbage": ([str(garbage)], "not a safetensors file"),
        "no_loader": (["--train-py", str(no_loader), "--checkpoint", str(garbage)], "load_for_eval"),
        # Bytes that are no pickle at all are not "pickled Python objects".
        "text": ([str(text)], "not a readable checkpoint (truncated or not a torch/safetensors file)"),
    }


@pytest.mark.parametrize("case", ["pickled", "garbage", "no_loader", "text"])
def test_unloadable_input_is_one_clear_line(case: str, sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args, expected = _bad_input_cases(tmp_path)[case]
    code, out, err = run_cli(["eval", *args, *FAST], capsys)
    lines = [line for line in err.splitlines() if line.startswith("trnf:")]
    assert code == 1 and out == ""
    assert len(lines) == 1 and expected in lines[0], err
    assert "Traceback" not in err


def test_a_path_with_nothing_to_score_refuses_the_command_before_any_worker(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outside's case: `trnf eval runs/nonexistent` printed "evaluating ..." and failed
    9.5 s later. A typo among several paths now costs nothing either."""
    _no_worker(monkeypatch)
    good = _save_run(tmp_path / "good", head_std=0.5)
    (tmp_path / "empty").mkdir()
    code, out, err = run_cli(["eval", str(good), str(tmp_path / "nope"), str(tmp_path / "empty"), *FAST], capsys)
    assert code == 2 and out == "" and "evaluating" not in err
    assert err.strip() == (
        f"trnf: error: {tmp_path / 'nope'}: no such checkpoint file or directory; {tmp_path / 'empty'}: holds no "
        "model.safetensors, final.pt, final/ or checkpoints/step_*/; nothing was scored"
    )


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--tokens", "many"], "--tokens"),
        (["--train-py", "x.py"], "--checkpoint"),
        ([], "at least one PATH"),
        (["--device", "banana"], "--device banana: unknown device; use cpu, cuda, neuron or auto"),
    ],
)
def test_usage_errors(args: list[str], expected: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = [str(tmp_path)] if args and args[0] in ("--tokens", "--device") else []
    code, _, err = run_cli(["eval", *target, *args], capsys)
    assert code == 2 and expected in err
    assert "evaluating" not in err  # refused before any worker started


def test_evaluation_over_the_timeout_is_reported(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Slow only at the evaluation's batch size (3), so the two checks stay fast.
    slow = KIT_MODELS["causal"].replace("return logits", "import time\n                    time.sleep(1.5 if idx.shape[0] == 3 else 0)\n                    return logits")
    train_py = _kit_train_py(tmp_path / "slow", slow)
    args = ["eval", "--train-py", str(train_py), "--checkpoint", str(train_py.parent / "final.pt"), "--json"]
    code, out, _ = run_cli([*args, "--tokens", "4096", "--seq-len", "64", "--batch-size", "3", "--device", "cpu", "--timeout", "1"], capsys)
    assert code == 1
    (result,) = json.loads(out)["results"]
    assert result["eval_over_timeout"] and result["status"] == "invalid"
    assert result["num_tokens"] < 4096


def test_a_hung_worker_is_killed_at_the_deadline(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from trnfrontier.evaluate import library as evaluation

    monkeypatch.setattr(evaluation, "LOAD_GRACE_SECONDS", 0.0)
    hung = tmp_path / "hung"
    train_py = _kit_train_py(hung, extra="import time\ntime.sleep(60)\n")
    code, _, err = run_cli(["eval", "--train-py", str(train_py), "--checkpoint", str(hung / "final.pt"), *FAST, "--timeout", "3"], capsys)
    assert code == 1 and "did not finish within 3 s" in err and "Traceback" not in err


@pytest.mark.slow
def test_eval_equals_the_trainers_recorded_val_bpb(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Train a tiny run, evaluate its final checkpoint: the same number, to the last bit."""
    monkeypatch.chdir(tmp_path)
    overrides = [
        "model.depth=1", "model.n_embd=32", "model.head_dim=16", "model.n_kv_head=1", "model.sequence_len=64",
        "data.batch_size=4", "budget.seconds=20", "budget.max_steps=5", "budget.checkpoint_reserve_seconds=1",
        "eval.tokens=4096", "eval.seq_len=64", "eval.batch_size=8", "runtime.threads=1", "run.checkpoint_every_seconds=null",
    ]
    code, _, err = run_cli(["train", "cpu_smoke", "--out", str(tmp_path / "run"), *overrides], capsys)
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    code, out, err = run_cli(["eval", str(tmp_path / "run"), "--json"], capsys)
    assert code == 0, err
    (result,) = json.loads(out)["results"]
    assert (result["seq_len"], result["tokens_requested"]) == (summary["eval_seq_len"], summary["eval_tokens"])
    assert result["val_bpb"] == summary["val_bpb"]
    assert result["matches_recorded"] is True


# ---------------------------------------------------------------------------- damaged checkpoints


def _published(tmp_path: Path) -> Path:
    """out/ as a generated train.py leaves it: the run in out/run/, its final checkpoint
    published to out/ by the generated program's own publish_final."""
    import importlib.util

    from trnfrontier.packaging.trainpy import render_train_py
    from trnfrontier.recipes.loading import load_recipe

    out = tmp_path / "team" / "out"
    _save_run(out / "run", head_std=0.5)
    source = render_train_py(load_recipe("cpu_smoke").model_dump(mode="json"), "package")
    (tmp_path / "team" / "train.py").write_text(source)
    spec = importlib.util.spec_from_file_location("generated_train", tmp_path / "team" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.publish_final(out / "run", out)
    return out


def _no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from trnfrontier.evaluate import library as evaluation

    def refuse(spec: object) -> dict:
        raise AssertionError("a damaged checkpoint reached the evaluation worker")

    monkeypatch.setattr(evaluation, "run_worker", refuse)


@pytest.mark.parametrize("how", ["path", "train_py"])
def test_a_flipped_byte_in_a_published_final_pt_is_refused_with_the_copy_to_restore(
    how: str, sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outside's case: one bit of out/final.pt flipped, scored as if nothing was wrong."""
    from tests.runtime.test_checkpoint_integrity import flip_byte

    out = _published(tmp_path)
    assert (out / "manifest.json").is_file()  # published with the files it describes
    flip_byte(out / "final.pt", 0.6)  # inside the tensor data: the file still loads
    _no_worker(monkeypatch)
    args = [str(out / "final.pt")] if how == "path" else ["--train-py", str(out.parent / "train.py"), "--checkpoint", str(out / "final.pt")]
    code, stdout, err = run_cli(["eval", *args, *FAST], capsys)
    (line,) = [line for line in err.splitlines() if line.startswith("trnf:")]
    assert code == 1 and stdout == "" and "Traceback" not in err
    assert line.startswith(f"trnf: error: {out / 'final.pt'} is damaged (its SHA256 differs")
    assert f"copy {out / 'run' / 'final' / 'final.pt'} over it" in line


def test_a_trnf_checkpoint_that_lost_its_manifest_is_refused(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _save_run(tmp_path / "run", head_std=0.5)
    (run / "final" / "manifest.json").unlink()
    _no_worker(monkeypatch)
    code, _, err = run_cli(["eval", str(run), *FAST], capsys)
    assert code == 1 and f"{run / 'final' / 'manifest.json'} is damaged (missing, so model.safetensors" in err


def test_a_checked_checkpoint_says_so_and_a_kit_one_says_it_was_not(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _save_run(tmp_path / "run", head_std=0.5)
    train_py = _kit_train_py(tmp_path / "kit")
    code, out, err = run_cli(["eval", str(run), "--train-py", str(train_py), "--checkpoint", str(train_py.parent / "final.pt"), *FAST], capsys)
    assert code == 0, err
    assert f"checkpoint files: size and SHA256 checked against {run / 'final' / 'manifest.json'}" in out
    assert "checkpoint files: not checked: no manifest records its SHA256" in out


def test_fewer_tokens_than_requested_says_so(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The outside's case: the header said 131,072 tokens and 48,896 were scored (the split
    holds no more), without a word. And a score at settings other than the run's is not
    called DIFFERENT from the trainer's number."""
    run = _save_run(tmp_path / "run", head_std=0.5)
    code, out, err = run_cli(["eval", str(run), "--tokens", "10000000", "--seq-len", "64", "--batch-size", "8", "--device", "cpu"], capsys)
    assert code == 0, err
    scored = int(out.split(" tokens scored of the 10,000,000 tokens (--tokens) requested: the validation split holds no more")[0].split()[-1].replace(",", ""))
    assert 0 < scored < 10_000_000
    assert "DIFFERENT" not in out


def _kit_run(tmp_path: Path) -> tuple[Path, Path]:
    """(train.py, the checkpoint) of a kit run as `trnf train --train-py` leaves it: runs/r1/out/final.pt,
    no manifest beside it, runs/r1/summary.json recording its SHA256."""
    from trnfrontier.runtime.integrity import file_sha256

    train_py = _kit_train_py(tmp_path / "kit")
    checkpoint = tmp_path / "kit" / "runs" / "r1" / "out" / "final.pt"
    checkpoint.parent.mkdir(parents=True)
    torch.save({"model_state": {"w": torch.arange(4096, dtype=torch.float32)}, "meta": {"step": 10}}, checkpoint)
    summary = {"status": "completed", "final_checkpoint": str(checkpoint), "checkpoint_sha256": file_sha256(checkpoint)}
    (checkpoint.parent.parent / "summary.json").write_text(json.dumps(summary))
    return train_py, checkpoint


def test_a_kit_checkpoint_is_checked_against_its_runs_summary(tmp_path: Path) -> None:
    from trnfrontier.evaluate.library import Target, check_target

    train_py, checkpoint = _kit_run(tmp_path)
    summary = checkpoint.parent.parent / "summary.json"
    assert check_target(Target(checkpoint, train_py)) == {"integrity": f"SHA256 checked against {summary} (the kit run's record)"}
    # a summary that names another file vouches for nothing here
    (summary).write_text(json.dumps({**json.loads(summary.read_text()), "final_checkpoint": str(tmp_path / "other.pt")}))
    assert check_target(Target(checkpoint, train_py)) == {"integrity": None}


def test_a_flipped_byte_in_a_kit_runs_final_pt_is_refused_by_name(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outside's case: `trnf eval --train-py train.py --checkpoint runs/r1/out/final.pt` scored a flipped bit."""
    from tests.runtime.test_checkpoint_integrity import flip_byte

    train_py, checkpoint = _kit_run(tmp_path)
    flip_byte(checkpoint, 0.6)  # inside the tensor data: the file still loads
    _no_worker(monkeypatch)
    code, stdout, err = run_cli(["eval", "--train-py", str(train_py), "--checkpoint", str(checkpoint), *FAST], capsys)
    (line,) = [line for line in err.splitlines() if line.startswith("trnf:")]
    assert code == 1 and stdout == "" and "Traceback" not in err
    summary = checkpoint.parent.parent / "summary.json"
    assert line.startswith(f"trnf: error: {checkpoint} is damaged (its SHA256 differs from the one {summary} recorded")
    assert "refusing to score it: restore the file from a copy, or train the run again" in line
