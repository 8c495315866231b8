"""The loss-curve PNG, the write-up's recipe table, and the generated train.py's environment handling."""

from __future__ import annotations

import importlib.util
import struct
import zlib
from pathlib import Path

from trnfrontier.packaging.trainpy import render_train_py
from trnfrontier.packaging.writeup import loss_curve_png, recipe_differences, render_writeup
from trnfrontier.recipes.loading import load_recipe


def _decode(png: bytes) -> tuple[int, int, list[bytes]]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        assert (
            struct.unpack(">I", png[pos + 8 + length : pos + 12 + length])[0]
            == zlib.crc32(kind + data) & 0xFFFFFFFF
        )
        chunks[kind] = data
        pos += 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    raw = zlib.decompress(chunks[b"IDAT"])
    rows = [raw[i * (3 * width + 1) + 1 : (i + 1) * (3 * width + 1)] for i in range(height)]
    return width, height, rows


def test_loss_curve_png_is_valid_deterministic_and_draws_the_curve() -> None:
    points = [(float(s), 9.0 - 0.5 * s) for s in range(1, 11)]
    png = loss_curve_png(points, width=200, height=100)
    assert png == loss_curve_png(points, width=200, height=100)
    width, height, rows = _decode(png)
    assert (width, height) == (200, 100) and all(len(r) == 600 for r in rows)
    blue = [
        (x, y)
        for y, row in enumerate(rows)
        for x in range(width)
        if row[3 * x : 3 * x + 3] == bytes((31, 119, 180))
    ]
    assert blue and min(blue)[1] < max(blue)[1]  # falling loss: starts high (small y) on the left
    assert _decode(loss_curve_png([]))[0] == 640


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
