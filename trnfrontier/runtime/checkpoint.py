"""Checkpoints: written atomically, loaded without unpickling anything.

A resumable checkpoint is a directory ``checkpoints/step_XXXXXX/``:

    model.safetensors   weights (float32 master copy), model config in its metadata
    meta.json           model config, recipe, step, tokens, charged seconds, SHA256s
    optim.pt            optimizer state dicts (torch.save; loaded with weights_only=True)
    state.json          per-rank data-loader state and Python/NumPy RNG states
    rng.safetensors     per-rank torch RNG states (CPU and device)

The final checkpoint ``final/`` is consolidated (one single-device file set):
``model.safetensors``, ``meta.json`` and the kit's ``final.pt`` (``model_state``,
``model_config``, ``meta``).

Atomicity: every checkpoint directory is written through ``atomic.write_directory``, so a
kill at any moment leaves either the old complete checkpoint or the new complete one,
never a torn one under a real name. Weights go through ``safetensors_io`` (standard
library only), so a submission needs no extra package.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
import torch.nn as nn

from trnfrontier.runtime.atomic import json_bytes, remove_leftovers, write_directory
from trnfrontier.runtime.checkpoint_ref import (
    check_resumable,
    list_checkpoints,
    resolve_checkpoint,
)
from trnfrontier.runtime.integrity import (
    CHECKPOINT_FORMAT,
    DamagedFileError,
    check_file,
    write_manifest,
)
from trnfrontier.runtime.model import GPT, ROTARY_CONTEXT_FACTOR, GPTConfig
from trnfrontier.runtime.rundir import (
    CHECKPOINTS_DIR,
    FINAL_DIR,
    KIT_FILE,
    META_FILE,
    MODEL_FILE,
    OPTIM_FILE,
    RNG_FILE,
    STATE_FILE,
)
from trnfrontier.runtime.safetensors_io import read_safetensors, write_safetensors

# ---------------------------------------------------------------------------- model state


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module):  # DDP and the like
            model = model.module
        else:
            return model


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The consolidated, single-device state dict: CPU tensors, wrapper prefixes removed."""
    state = unwrap(model).state_dict()
    return {name: t.detach().to("cpu").contiguous() for name, t in state.items()}


def _clean_keys(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in state.items():
        for prefix in ("module.", "_orig_mod."):
            while name.startswith(prefix):
                name = name[len(prefix) :]
        out[name] = t
    return out


def build_model(
    config: Mapping[str, Any], state: Mapping[str, torch.Tensor], device: str | torch.device = "cpu"
) -> GPT:
    """A GPT from a stored config and state dict, without drawing random numbers."""
    cfg = GPTConfig.from_dict(dict(config))
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device=torch.device(device))
    model.load_state_dict(_clean_keys(state), strict=True)
    # The rotary tables are not stored (derived from the config); rebuild them.
    model.init_rotary(cfg.sequence_len * ROTARY_CONTEXT_FACTOR)
    return model


def _model_writer(
    state: Mapping[str, torch.Tensor], config: Mapping[str, Any]
) -> Callable[[IO[bytes]], object]:
    metadata = {"format": "pt", "model_config": json.dumps(dict(config), sort_keys=True)}
    return lambda handle: write_safetensors(handle, state, metadata)


def _json_writer(document: Any) -> Callable[[IO[bytes]], object]:
    raw = json_bytes(document)
    return lambda handle: handle.write(raw)


def _torch_writer(obj: Any) -> Callable[[IO[bytes]], object]:
    return lambda handle: torch.save(obj, handle)


def _config_of(model: nn.Module) -> dict[str, Any]:
    return unwrap(model).config.to_dict()


# ---------------------------------------------------------------------------- RNG state


def capture_rng(device: torch.device) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON-able Python/NumPy RNG state, torch RNG state tensors) of this process."""
    version, internal, gauss = random.getstate()
    np_state: Any = np.random.get_state()
    plain = {
        "python": [version, list(internal), gauss],
        "numpy": [
            np_state[0],
            np_state[1].tolist(),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ],
    }
    tensors = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        tensors["device"] = torch.cuda.get_rng_state(device)
    return plain, tensors


def restore_rng(
    plain: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], device: torch.device
) -> None:
    version, internal, gauss = plain["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])
    if device.type == "cuda" and "device" in tensors:
        torch.cuda.set_rng_state(tensors["device"], device)


# ---------------------------------------------------------------------------- resumable checkpoints


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) state: what a checkpoint of it takes on disk,
    near enough to tell the user how much space a write needs."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def save_checkpoint(
    run_dir: Path,
    *,
    step: int,
    model: nn.Module,
    optimizers: Iterable[torch.optim.Optimizer],
    meta: Mapping[str, Any],
    rank_states: list[dict[str, Any]],
    rank_rng: list[dict[str, torch.Tensor]],
    keep_last: int = 2,
    optim_states: list[dict[str, Any]] | None = None,
) -> Path:
    """Write ``checkpoints/step_XXXXXX/`` atomically and keep the newest ``keep_last``.

    ``rank_states[r]`` is rank r's JSON-able state (data-loader state, Python/NumPy RNG);
    ``rank_rng[r]`` its torch RNG tensors. ``optim_states``: the optimizers' state dicts
    when they are not the ``optimizers``' own (a sharded optimizer's, gathered to rank 0
    in the same layout). Call on rank 0 only.
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    remove_leftovers(root)  # safe: only rank 0 writes checkpoints, one at a time
    config = _config_of(model)
    full_meta = {**meta, "format": CHECKPOINT_FORMAT, "step": step, "model_config": config}
    state = {"step": step, "ranks": rank_states}
    rng = {
        f"rank{r}.{name}": t for r, tensors in enumerate(rank_rng) for name, t in tensors.items()
    }
    if optim_states is None:
        optim_states = [opt.state_dict() for opt in optimizers]
    optim_state = {"optimizers": optim_states}
    weights = model_state(model)
    target = write_directory(
        root / step_dir_name(step),
        {
            MODEL_FILE: _model_writer(weights, config),
            OPTIM_FILE: _torch_writer(optim_state),
            RNG_FILE: lambda handle: write_safetensors(handle, rng),
            STATE_FILE: _json_writer(state),
            META_FILE: _json_writer(full_meta),
        },
        before_rename=write_manifest,
        expected_bytes=tensor_bytes(weights) + tensor_bytes(optim_state) + tensor_bytes(rng),
        what="the checkpoint",
    )
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return target


def drop_older_checkpoints(run_dir: Path, keep_last: int = 1) -> list[Path]:
    """Remove all but the newest ``keep_last`` resumable checkpoints; returns what went."""
    found = list_checkpoints(run_dir)
    dropped = found[:-keep_last] if keep_last > 0 else found
    for old in dropped:
        shutil.rmtree(old, ignore_errors=True)
    return dropped


def load_checkpoint(
    checkpoint_dir: Path,
    model: nn.Module,
    optimizers: Iterable[torch.optim.Optimizer],
    device: torch.device,
    rank: int = 0,
) -> dict[str, Any]:
    """Restore weights and optimizer state in place; return ``{"meta", "state", "rng"}``
    where ``state`` is this rank's saved state and ``rng`` its torch RNG tensors."""
    checkpoint_dir = Path(checkpoint_dir)
    check_resumable(checkpoint_dir)
    meta = json.loads((checkpoint_dir / META_FILE).read_text(encoding="utf-8"))
    weights, _ = read_safetensors(checkpoint_dir / MODEL_FILE)
    unwrap(model).load_state_dict(_clean_keys(weights), strict=True)
    optim_state = torch.load(checkpoint_dir / OPTIM_FILE, map_location=device, weights_only=True)
    optimizers = list(optimizers)
    saved = optim_state["optimizers"]
    if len(saved) != len(optimizers):
        raise ValueError(
            f"{checkpoint_dir}: {len(saved)} optimizer states for {len(optimizers)} optimizers"
        )
    for opt, sd in zip(optimizers, saved, strict=True):
        opt.load_state_dict(sd)
    state = json.loads((checkpoint_dir / STATE_FILE).read_text(encoding="utf-8"))
    ranks = state["ranks"]
    if rank >= len(ranks):
        raise ValueError(
            f"{checkpoint_dir} was written by {len(ranks)} ranks; rank {rank} has no state (resume with the same --nproc)"
        )
    rng_all, _ = (
        read_safetensors(checkpoint_dir / RNG_FILE)
        if (checkpoint_dir / RNG_FILE).is_file()
        else ({}, {})
    )
    prefix = f"rank{rank}."
    rng = {name[len(prefix) :]: t for name, t in rng_all.items() if name.startswith(prefix)}
    return {"meta": meta, "state": ranks[rank], "rng": rng}


# ---------------------------------------------------------------------------- final checkpoint


def save_final(run_dir: Path, model: nn.Module, meta: Mapping[str, Any]) -> Path:
    """Write the consolidated ``final/``: model.safetensors, meta.json and the kit's final.pt."""
    config = _config_of(model)
    full_meta = {**meta, "format": CHECKPOINT_FORMAT, "model_config": config}
    state = model_state(model)
    kit = {"model_state": state, "model_config": config, "meta": json.loads(json.dumps(full_meta))}
    return write_directory(
        Path(run_dir) / FINAL_DIR,
        {
            MODEL_FILE: _model_writer(state, config),
            KIT_FILE: _torch_writer(kit),
            META_FILE: _json_writer(full_meta),
        },
        before_rename=write_manifest,
        expected_bytes=2 * tensor_bytes(state),  # model.safetensors and final.pt
        what="the final checkpoint",
    )


def read_model_file(
    path: str | os.PathLike[str],
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """(model config, CPU state dict, meta) from any accepted checkpoint path."""
    file = resolve_checkpoint(path).model_file
    # Where trnf wrote the checkpoint, its manifest says what the bytes must be; a kit's
    # own final.pt has none and loads as it is.
    meta_path = file.with_name(META_FILE)
    try:
        check_file(file)
        if file.suffix == ".safetensors" and meta_path.is_file():
            check_file(meta_path)
    except DamagedFileError as exc:
        raise DamagedFileError(
            exc.path, f"{exc.problem}; its weights cannot be trusted: restore the file from a copy or train the run again"
        ) from None
    if file.suffix == ".safetensors":
        state, metadata = read_safetensors(file)
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        config = meta.get("model_config")
        if config is None and "model_config" in metadata:
            config = json.loads(metadata["model_config"])
        if config is None:
            raise ValueError(
                f"{file}: no model config (neither meta.json beside it nor in its metadata)"
            )
        return config, state, meta
    blob = torch.load(file, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or "model_state" not in blob or "model_config" not in blob:
        raise ValueError(
            f"{file}: not a final.pt (expected a dict with model_state and model_config)"
        )
    return blob["model_config"], blob["model_state"], blob.get("meta") or {}


def load_model(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> GPT:
    """A GPT from a run dir, checkpoint dir, model.safetensors or final.pt, on ``device``."""
    config, state, _ = read_model_file(path)
    return build_model(config, state, device)


def load_for_eval(checkpoint_path: str, device: str | torch.device = "cpu") -> nn.Module:
    """The kit's entry point: a consolidated, single-device, eval-mode model whose forward
    is pure and causal. Gradients are off; nothing is pickled on the way in."""
    model = load_model(checkpoint_path, device)
    model.eval()
    model.requires_grad_(False)
    return model
