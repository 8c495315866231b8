"""The write-up's recipe table and the generated train.py's environment handling (the loss curve: tests/test_plots.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from trnfrontier.contract.kit import OUT_DIR_ENV
from trnfrontier.packaging.trainpy import render_train_py
from trnfrontier.packaging.writeup import recipe_differences, render_writeup
from trnfrontier.recipes.loading import load_recipe


def test_writeup_lists_recipe_differences_and_forced_reasons() -> None:
    base = load_recipe("baseline_d10").model_dump(mode="json")
    mine = load_recipe("baseline_d10", ["model.depth=12", "optim.matrix_lr=0.03"]).model_dump(
        mode="json"
    )
    diffs = recipe_differences(mine, base)
    assert (
        ("model.depth", 10, 12) in diffs
        and ("optim.matrix_lr", 0.02, 0.03) in diffs
        and len(diffs) == 2
    )
    text = render_writeup(
        {"name": "r", "val_bpb": 1.234567891, "mfu": 0.3}, diffs, forced=["over budget: x"]
    )
    assert (
        "| model.depth | `10` | `12` |" in text
        and "1.234568" in text
        and "30.0%" in text
        and "- over budget: x" in text
    )
    assert "not measured" in text  # official val_bpb, tokens/s ...


def test_generated_train_py_shrinks_a_dry_run_and_honours_the_device(tmp_path: Path) -> None:
    recipe = load_recipe("baseline_d10").model_dump(mode="json")
    path = tmp_path / "train.py"
    path.write_text(render_train_py(recipe, "package"))
    spec = importlib.util.spec_from_file_location("generated_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    assert module.RECIPE == recipe and module.effective_recipe(recipe, {}) == recipe
    dry = module.effective_recipe(
        recipe, {"TRNF_DRY_RUN_STEPS": "3", "TRNF_DEVICE": "cpu", "WORLD_SIZE": "4"}
    )
    assert dry["budget"]["max_steps"] == 3 and dry["eval"]["final"] is False
    assert dry["runtime"]["device"] == "cpu" and dry["runtime"]["dtype"] == "float32"
    assert dry["data"]["batch_size"] == 2 and dry["data"]["total_batch_tokens"] == 2 * 1024 * 4 * 2
    assert recipe["data"]["batch_size"] == 32  # the embedded recipe is untouched


def test_generated_train_py_publishes_where_the_kit_knob_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NEURON_COMPETITION_R1_OUT_DIR moves out/ (final.pt and the run), as for the kit's train.py;
    unset or empty, it is out/ beside the working directory."""
    path = tmp_path / "train.py"
    path.write_text(render_train_py(load_recipe("cpu_smoke").model_dump(mode="json"), "single"))

    def out_dirs(value: str | None) -> tuple[Path, Path]:
        if value is None:
            monkeypatch.delenv(OUT_DIR_ENV, raising=False)
        else:
            monkeypatch.setenv(OUT_DIR_ENV, value)
        spec = importlib.util.spec_from_file_location(f"generated_{len(str(value))}", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        monkeypatch.setitem(sys.modules, spec.name, module)  # type: ignore[union-attr]  # its dataclasses look it up
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module.OUT_DIR, module.RUN_DIR

    assert out_dirs(str(tmp_path / "mine")) == (tmp_path / "mine", tmp_path / "mine" / "run")
    assert out_dirs(None) == (Path("out"), Path("out") / "run") == out_dirs("")


def test_a_single_file_train_py_scores_ragged_batches_as_the_runtime_does(tmp_path: Path, monkeypatch) -> None:
    # The single file leaves CORE's ragged forward out (the portal's size limit); the
    # model's ragged methods then take its plain forward, with the same logits.
    from trnfrontier.runtime.model import GPT, GPTConfig

    path = tmp_path / "train.py"
    path.write_text(render_train_py(load_recipe("cpu_smoke").model_dump(mode="json"), "single"))
    assert "def layout(" not in path.read_text()
    spec = importlib.util.spec_from_file_location("generated_ragged", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, spec.name, module)  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    config = dict(vocab_size=64, sequence_len=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32)
    torch.manual_seed(0)
    ours = GPT(GPTConfig(**config)).eval()
    for block in ours.blocks:
        torch.nn.init.normal_(block.attn.c_proj.weight, std=0.1)
        torch.nn.init.normal_(block.mlp.c_proj.weight, std=0.1)
    single = module.GPT(module.GPTConfig(**config)).eval()
    single.load_state_dict(ours.state_dict())
    prefix, rows = torch.randint(0, 64, (2, 5)), torch.randint(0, 64, (3, 6))
    args = (prefix, torch.tensor([5, 2]), rows, torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2, 2]), torch.tensor([0, 5, 1, 3]))
    with torch.no_grad():
        torch.testing.assert_close(single.logits_ragged(*args), ours.logits_ragged(*args), atol=1e-5, rtol=1e-5)
