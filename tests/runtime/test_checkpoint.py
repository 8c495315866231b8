"""Checkpoints: atomic writes, exact round trips, the kit's final.pt, no unpickling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trnfrontier.runtime import atomic
from trnfrontier.runtime import checkpoint as ck
from trnfrontier.runtime.checkpoint_ref import latest_checkpoint, list_checkpoints
from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.optim import build_optimizers
from trnfrontier.runtime.recipe import OptimSpec
from trnfrontier.runtime.safetensors_io import read_safetensors, write_safetensors

torch.set_num_threads(1)

TINY = dict(
    vocab_size=64, sequence_len=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32, value_embeds=True
)
OPTIM = OptimSpec(normuon=True)


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**TINY))


def trained(seed: int = 0) -> tuple[GPT, list[torch.optim.Optimizer]]:
    model = tiny_model(seed)
    opts = build_optimizers(model, OPTIM)
    g = torch.Generator().manual_seed(seed)
    for _ in range(2):
        x = torch.randint(0, 64, (2, 16), generator=g)
        model.loss(x, x.roll(-1, 1)).backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
    return model, opts


def save_step(run: Path, step: int, model: GPT, opts, data_state=None) -> Path:
    plain, tensors = ck.capture_rng(torch.device("cpu"))
    return ck.save_checkpoint(
        run,
        step=step,
        model=model,
        optimizers=opts,
        meta={"tokens": step * 32, "charged_seconds": 1.5 * step},
        rank_states=[{"data": data_state or {"pos": step}, "rng": plain}],
        rank_rng=[tensors],
    )


# ---------------------------------------------------------------------------- safetensors


def test_safetensors_round_trip_and_package_compatibility(tmp_path: Path) -> None:
    tensors = {
        "a": torch.randn(3, 4),
        "b": torch.randn(5).to(torch.bfloat16),
        "c": torch.arange(7, dtype=torch.int64),
        "empty": torch.empty(0, 3),
        "u": torch.tensor([1, 2, 255], dtype=torch.uint8),
    }
    path = tmp_path / "x.safetensors"
    atomic.atomic_write(path, lambda h: write_safetensors(h, tensors, {"k": "v"}))
    loaded, meta = read_safetensors(path)
    assert meta == {"k": "v"}
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t)
    st = pytest.importorskip("safetensors.torch")
    theirs = st.load_file(str(path))
    assert all(torch.equal(theirs[n], tensors[n]) for n in tensors)
    other = tmp_path / "y.safetensors"
    st.save_file({"w": torch.randn(2, 2).to(torch.bfloat16)}, str(other), metadata={"m": "1"})
    mine, meta2 = read_safetensors(other)
    assert meta2 == {"m": "1"} and mine["w"].dtype == torch.bfloat16


def test_safetensors_rejects_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_safetensors(bad)


# ---------------------------------------------------------------------------- atomic writes


def test_atomic_write_failure_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic.atomic_write_json(path, {"v": 1})

    def boom(handle):
        handle.write(b"{partial")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic.atomic_write(path, boom)
    assert json.loads(path.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_checkpoint_failing_mid_write_never_replaces_the_last_good_one(
    tmp_path: Path, monkeypatch
) -> None:
    model, opts = trained()
    good = save_step(tmp_path, 1, model, opts)
    before = (good / ck.MODEL_FILE).read_bytes()

    real = atomic._write_file
    calls = {"n": 0}

    def dying(path, write):
        calls["n"] += 1
        if calls["n"] == 3:  # the third file of the new checkpoint
            raise KeyboardInterrupt("killed mid-write")
        real(path, write)

    monkeypatch.setattr(atomic, "_write_file", dying)
    with pytest.raises(KeyboardInterrupt):
        save_step(tmp_path, 2, model, opts)
    assert latest_checkpoint(tmp_path) == good
    assert (good / ck.MODEL_FILE).read_bytes() == before
    assert not (tmp_path / "checkpoints" / "step_000002").exists()


def test_overwriting_the_same_step_failing_keeps_the_old_one(tmp_path: Path, monkeypatch) -> None:
    model, opts = trained()
    good = save_step(tmp_path, 3, model, opts, data_state={"pos": "old"})
    monkeypatch.setattr(atomic, "fsync_dir", lambda p: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        save_step(tmp_path, 3, model, opts, data_state={"pos": "new"})
    monkeypatch.undo()
    state = json.loads((good / ck.STATE_FILE).read_text())
    assert state["ranks"][0]["data"] == {"pos": "old"}


KILLER = textwrap.dedent(
    """
    import os, signal, sys, torch
    from pathlib import Path
    from trnfrontier.runtime import atomic
    from trnfrontier.runtime import checkpoint as ck
    from trnfrontier.runtime.model import GPT, GPTConfig
    from trnfrontier.runtime.optim import build_optimizers
    from trnfrontier.runtime.recipe import OptimSpec
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{tiny}))
    opts = build_optimizers(model, {optim})
    real = atomic._write_file
    n = [0]
    def dying(path, write):
        n[0] += 1
        if n[0] == {kill_at}:
            with open(path, "wb") as h:
                h.write(b"half a file")
            os.kill(os.getpid(), signal.SIGKILL)
        real(path, write)
    atomic._write_file = dying
    ck.save_checkpoint(Path(sys.argv[1]), step=int(sys.argv[2]), model=model, optimizers=opts,
                       meta={{}}, rank_states=[{{}}], rank_rng=[{{}}])
    """
)


@pytest.mark.parametrize("kill_at", [1, 4])
def test_kill_9_during_checkpoint_write_keeps_the_last_good_one(
    tmp_path: Path, kill_at: int
) -> None:
    model, opts = trained()
    good = save_step(tmp_path, 5, model, opts)
    script = tmp_path / "killer.py"
    script.write_text(KILLER.format(tiny=TINY, optim=OPTIM, kill_at=kill_at))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "6"], capture_output=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert latest_checkpoint(tmp_path) == good
    assert any(p.name.startswith(".tmp-") for p in (tmp_path / "checkpoints").iterdir())
    # The next save clears the dead writer's leftovers.
    save_step(tmp_path, 7, model, opts)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000005", "step_000007"]


# ---------------------------------------------------------------------------- resumable round trip


def test_checkpoint_round_trip_restores_weights_optimizer_and_rng(tmp_path: Path) -> None:
    model, opts = trained()
    torch.manual_seed(123)
    path = save_step(tmp_path, 2, model, opts, data_state={"shard": 0, "offset": 77})
    expected_rand = torch.rand(3)

    fresh = tiny_model(seed=99)
    fresh_opts = build_optimizers(fresh, OPTIM)
    restored = ck.load_checkpoint(path, fresh, fresh_opts, torch.device("cpu"))
    assert restored["meta"]["step"] == 2 and restored["meta"]["tokens"] == 64
    assert restored["meta"]["model_config"]["n_embd"] == 32
    assert restored["state"]["data"] == {"shard": 0, "offset": 77}
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    ck.restore_rng(restored["state"]["rng"], restored["rng"], torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected_rand)

    # One more identical step on both gives identical weights: the optimizer state came back.
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(5))
    for m, os_ in ((model, opts), (fresh, fresh_opts)):
        m.loss(x, x.roll(-1, 1)).backward()
        for o in os_:
            o.step()
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


def test_keeps_only_the_last_checkpoints(tmp_path: Path) -> None:
    model, opts = trained()
    for step in (1, 2, 3, 4):
        save_step(tmp_path, step, model, opts)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000003", "step_000004"]


def test_optimizer_state_is_loaded_with_weights_only(tmp_path: Path, monkeypatch) -> None:
    model, opts = trained()
    path = save_step(tmp_path, 1, model, opts)
    seen = []
    real = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    ck.load_checkpoint(
        path, tiny_model(), build_optimizers(tiny_model(), OPTIM), torch.device("cpu")
    )
    assert seen == [True]


# ---------------------------------------------------------------------------- final checkpoint


def test_final_checkpoint_loads_from_every_accepted_path(tmp_path: Path) -> None:
    model, _ = trained()
    final = ck.save_final(tmp_path, model, {"step": 2, "recipe": {"name": "t"}})
    x = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x)
    for path in (tmp_path, final, final / ck.MODEL_FILE, final / ck.KIT_FILE):
        loaded = ck.load_for_eval(str(path), "cpu")
        assert not loaded.training
        assert not any(p.requires_grad for p in loaded.parameters())
        with torch.no_grad():
            assert torch.equal(loaded(x), want), path


def test_lone_model_safetensors_carries_its_config(tmp_path: Path) -> None:
    model, _ = trained()
    final = ck.save_final(tmp_path, model, {})
    lone = tmp_path / "lone.safetensors"
    lone.write_bytes((final / ck.MODEL_FILE).read_bytes())
    assert ck.load_model(lone).config == model.config


def test_kit_final_pt_layout_loads_with_weights_only(tmp_path: Path) -> None:
    model, _ = trained()
    final = ck.save_final(
        tmp_path, model, {"val_bpb": None, "recipe": {"optim": {"adam_betas": [0.8, 0.95]}}}
    )
    blob = torch.load(final / ck.KIT_FILE, map_location="cpu", weights_only=True)
    assert set(blob) == {"model_state", "model_config", "meta"}
    assert blob["model_config"] == model.config.to_dict()
    assert set(blob["model_state"]) == set(model.state_dict())


def test_run_dir_without_final_falls_back_to_the_latest_checkpoint(tmp_path: Path) -> None:
    model, opts = trained()
    save_step(tmp_path, 1, model, opts)
    assert ck.load_model(tmp_path).config == model.config


def test_load_model_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such"):
        ck.load_model(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="holds no"):
        ck.load_model(tmp_path)
    bogus = tmp_path / "final.pt"
    torch.save({"weights": torch.zeros(1)}, bogus)
    with pytest.raises(ValueError, match="not a final.pt"):
        ck.load_model(bogus)


def test_loading_draws_no_random_numbers(tmp_path: Path) -> None:
    model, _ = trained()
    ck.save_final(tmp_path, model, {})
    torch.manual_seed(7)
    ck.load_for_eval(str(tmp_path))
    after = torch.rand(1)
    torch.manual_seed(7)
    assert torch.equal(torch.rand(1), after)


def test_unwrap_strips_wrappers() -> None:
    model = tiny_model()

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.module = m

    assert ck.unwrap(Wrapper(model)) is model
    assert set(ck.model_state(Wrapper(model))) == set(model.state_dict())


@pytest.mark.skipif(os.name != "posix", reason="fsync of directories is POSIX")
def test_fsync_dir_tolerates_missing(tmp_path: Path) -> None:
    atomic.fsync_dir(tmp_path / "nope")


def test_one_resolution_of_a_checkpoint_path_for_weights_meta_and_run(tmp_path: Path) -> None:
    """trnf eval's recorded settings and the worker's weights come from the same files."""
    from trnfrontier.runtime.checkpoint_ref import resolve_checkpoint

    run = tmp_path / "run"
    step = run / "checkpoints" / "step_000004"
    step.mkdir(parents=True)
    for name in ("model.safetensors", "meta.json", "optim.pt", "state.json"):
        (step / name).write_text("{}")
    (run / "summary.json").write_text("{}")
    ref = resolve_checkpoint(run)  # no final/: the latest resumable checkpoint
    assert ref.model_file == step / "model.safetensors" and ref.meta_file == step / "meta.json"
    assert ref.run_dir == run and not ref.is_final
    (run / "final").mkdir()
    (run / "final" / "final.pt").write_bytes(b"")
    for given in (run, run / "final", run / "final" / "final.pt"):
        ref = resolve_checkpoint(given)
        assert ref.model_file == run / "final" / "final.pt" and ref.is_final and ref.run_dir == run, given
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        resolve_checkpoint(tmp_path / "absent")
