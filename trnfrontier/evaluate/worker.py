"""The fresh process behind `trnf eval`: load one model, check it, score it, print one JSON object.

    python -m trnfrontier.evaluate.worker '<spec as JSON>'

Why a separate process: a score must not depend on anything a training process left
behind (compiled graphs, RNG state, patched modules, a half-initialised process group).
This process starts from nothing, loads the trusted prepare.py, loads the model the way
the scorer does, and runs:

1. the SHA256 check of the checkpoint's prepare.py / tokenizer against the current ones
   (refused unless ``allow_mismatch``),
2. the contract's ``causality_check``,
3. a batch-independence check (a row's logits must not depend on the batch size, on the
   other rows, or on earlier calls: the contract says forward is pure and stateless),
4. the trusted ``evaluate_bpb`` on the public validation split,
5. optionally greedy and temperature samples from a prompt.

Whatever the model's own code prints goes to stderr; stdout carries exactly one JSON
object. A failure the user can act on is reported as ``{"error": ..., "error_kind": ...}``
with exit code 1, never as a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from trnfrontier.errors import TrnfError
from trnfrontier.evaluate.spec import WorkerSpec
from trnfrontier.progress import FileSteps, Steps
from trnfrontier.runtime import distributed, prepare_calls
from trnfrontier.trusted_prepare import load_contract, tokenizer_sha256_of

# Tolerances for the batch-independence check, relative to the logits' magnitude. A row
# evaluated alone and inside a batch may legitimately differ by matmul blocking order
# (fp32: ~1e-6 relative); a model that mixes rows differs by O(1).
_BATCH_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
_LOW_PRECISION_TOLERANCE = 3e-2


class WorkerError(Exception):
    """A failure to report as one line, with a machine-readable kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ----------------------------------------------------------------------------- loading


def _import_train_py(path: Path) -> ModuleType:
    """Import a kit-style train.py by path without running its ``__main__`` block.

    Not prepare.py's own helper: the trusted prepare.py may be the organisers' copy, and
    an import failure here must come back as one line, not a traceback.
    """
    if not path.is_file():
        raise WorkerError("load", f"--train-py {path}: no such file")
    # Its sibling modules (kernels, helpers) import the way they do under torchrun.
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("trnf_submitted_train", path)
    if spec is None or spec.loader is None:
        raise WorkerError("load", f"--train-py {path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise WorkerError("load", f"--train-py {path} does not parse ({exc.msg}, line {exc.lineno})") from None
    except Exception as exc:  # the file is foreign code; any failure is the user's to fix
        raise WorkerError("load", f"--train-py {path} failed to import: {type(exc).__name__}: {exc}") from None
    return module


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _explain_load_failure(target: str, exc: BaseException) -> WorkerError:
    """Turn whatever a checkpoint loader raised into one line that says what to do.

    ``target`` names the loader for kit checkpoints; for trnf checkpoints it is empty,
    since `trnf eval` prefixes every message with the path it was given."""
    where = f"{target}: " if target else ""
    text = str(exc)
    from trnfrontier.runtime.integrity import DamagedFileError

    if isinstance(exc, DamagedFileError):  # already one line naming the file and the remedy
        return WorkerError("load", f"{where}{text}")
    # torch.load(weights_only=True) names the class it refused ("Unsupported global"); any
    # other unpickling failure (a text file, a bare pickle) means the bytes are no checkpoint.
    if "Unsupported global" in text:
        return WorkerError(
            "pickled-object",
            f"{where}the checkpoint holds pickled Python objects, not only tensors; refusing to unpickle it "
            "(save a state_dict / safetensors instead)",
        )
    if (
        isinstance(exc, (zipfile.BadZipFile, EOFError, pickle.UnpicklingError))
        or "weights_only" in text
        or "failed finding central directory" in text
    ):
        return WorkerError("load", f"{where}not a readable checkpoint (truncated or not a torch/safetensors file)")
    if isinstance(exc, FileNotFoundError):
        return WorkerError("load", f"{where}{_one_line(exc)}")
    return WorkerError("load", f"{where}cannot load the model: {_one_line(exc)}")


def load_kit_model(train_py: Path, checkpoint: Path, device: torch.device) -> torch.nn.Module:
    """The scorer's way: ``train.load_for_eval(checkpoint_path, device)``."""
    module = _import_train_py(train_py)
    loader = getattr(module, "load_for_eval", None)
    if not callable(loader):
        raise WorkerError("load", f"--train-py {train_py} defines no load_for_eval(checkpoint_path, device); the scorer needs it")
    if not checkpoint.exists():
        raise WorkerError("load", f"--checkpoint {checkpoint}: no such file")
    try:
        model = loader(str(checkpoint), device)
    except Exception as exc:
        raise _explain_load_failure(f"{train_py}:load_for_eval({checkpoint})", exc) from None
    return model


def read_trnf_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """(model config, state dict, meta) of a run directory, checkpoint directory or file
    written by `trnf train`, through the trainer's reader (nothing is unpickled)."""
    if not path.exists():
        raise WorkerError("load", "no such file or directory")
    from trnfrontier.runtime.checkpoint import read_model_file

    try:
        return read_model_file(path)
    except FileNotFoundError as exc:  # a folder without a checkpoint; `trnf eval` prefixes the path
        raise WorkerError("load", str(exc).removeprefix(f"{path}: ")) from None
    except Exception as exc:
        raise _explain_load_failure("", exc) from None


def build_trnf_model(config: dict[str, Any], state: dict[str, torch.Tensor], device: torch.device) -> torch.nn.Module:
    from trnfrontier.runtime.checkpoint import build_model

    try:
        model = build_model(config, state, device)
    except Exception as exc:
        raise _explain_load_failure("", exc) from None
    model.requires_grad_(False)
    return model


# ----------------------------------------------------------------------------- checks


def _logits(model: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    out = model(idx)
    if not isinstance(out, torch.Tensor):
        raise WorkerError("contract", f"model forward returned {type(out).__name__}, not a logits tensor [B, T, vocab]")
    return out


@torch.no_grad()
def batch_independence_check(
    model: torch.nn.Module, vocab_size: int, seq_len: int, device: torch.device, rows: int = 4, seed: int = 0
) -> dict[str, Any]:
    """Row r's logits alone, inside a batch, inside a batch with other neighbours, and on a
    second call must agree: the contract's forward is pure and stateless."""
    generator = torch.Generator().manual_seed(seed)
    batch = torch.randint(0, vocab_size, (rows, seq_len), generator=generator).to(device)
    reference = _logits(model, batch).float()
    again = _logits(model, batch).float()
    shuffled = batch.clone()
    shuffled[1:] = torch.randint(0, vocab_size, (rows - 1, seq_len), generator=generator).to(device)
    row0_with_other_neighbours = _logits(model, shuffled)[0].float()
    diffs = [
        (again - reference).abs().max().item(),
        (row0_with_other_neighbours - reference[0]).abs().max().item(),
    ]
    for r in range(rows):
        alone = _logits(model, batch[r : r + 1])[0].float()
        diffs.append((alone - reference[r]).abs().max().item())
    max_abs_diff = max(diffs)
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    relative = _BATCH_TOLERANCE.get(dtype, _LOW_PRECISION_TOLERANCE)
    tolerance = relative * max(1.0, reference.abs().max().item())
    return {"passed": bool(max_abs_diff <= tolerance), "max_abs_diff": max_abs_diff, "tolerance": tolerance, "rows": rows}


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: list[int],
    new_tokens: int,
    context: int,
    device: torch.device,
    temperature: float,
    generator: torch.Generator,
) -> list[int]:
    """Plain autoregressive sampling (no KV cache: the contract's forward takes token ids only)."""
    ids = list(prompt_ids)
    for _ in range(new_tokens):
        window = torch.tensor([ids[-context:]], dtype=torch.long, device=device)
        logits = _logits(model, window)[0, -1].float().cpu()
        if temperature <= 0:
            ids.append(int(logits.argmax()))
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            ids.append(int(torch.multinomial(probs, 1, generator=generator)))
    return ids[len(prompt_ids) :]


# ----------------------------------------------------------------------------- the run


def _resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto``/``cpu``/``cuda``/``neuron`` as the trainer resolves them (importing
    torch-neuronx registers ``neuron``); an indexed name (``cuda:1``) as torch reads it."""
    from trnfrontier.runtime import devices

    try:
        if name in ("auto", "cpu", "cuda", "neuron"):
            return devices.resolve_device(name, local_rank)
        device = torch.device(name)
    except (devices.DeviceError, RuntimeError) as exc:
        raise WorkerError("usage", f"--device {name}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise WorkerError("usage", f"--device {name}: CUDA is not available on this machine")
    return device


def _mismatches(meta: dict[str, Any] | None, current: dict[str, str | None]) -> list[str]:
    if not meta:
        return []
    found = []
    for key, label in (("prepare_sha256", "prepare.py"), ("tokenizer_sha256", "tokenizer")):
        recorded, now = meta.get(key), current.get(key)
        if recorded and now and recorded != now:
            found.append(f"{label} SHA256 {recorded[:12]}… recorded with the checkpoint != current {now[:12]}…")
    return found


def run(spec: WorkerSpec) -> dict[str, Any]:
    torch.set_grad_enabled(False)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    contract = load_contract()
    prepare = contract.module
    info = distributed.dist_info()
    device = _resolve_device(spec.device or "auto", info.local_rank)
    distributed.init(device, info)  # under torchrun (--nproc): CORE's items and the validation rows are shared
    try:
        tokenizer = prepare_calls.ensure_tokenizer(prepare)
    except Exception as exc:
        raise WorkerError("data", f"no tokenizer for the active dataset ({_one_line(exc)}); run `trnf prepare` first") from None
    # The organisers' Tokenizer carries no SHA256: its pin is the artifact beside their prepare.py.
    tokenizer_sha = getattr(tokenizer, "sha256", None) or tokenizer_sha256_of(contract.path)[0]
    current = {"prepare_sha256": contract.sha256, "tokenizer_sha256": tokenizer_sha}
    result: dict[str, Any] = {"device": str(device), "prepare_path": str(contract.path), **current}
    if spec.core is not None:
        _check_core(spec, tokenizer)  # a bundle item no model can score fails before the load

    started = time.perf_counter()
    if spec.train_py:
        checkpoint = Path(spec.checkpoint or spec.path)
        # A kit checkpoint has no trnf reader; `trnf eval` passes the SHA256s of the
        # meta.json `trnf train` wrote beside it, when there is one.
        meta = spec.recorded_shas
    else:
        checkpoint = Path(spec.path)
        config, state, meta = read_trnf_checkpoint(checkpoint)
    result["checkpoint_prepare_sha256"] = (meta or {}).get("prepare_sha256")
    result["checkpoint_tokenizer_sha256"] = (meta or {}).get("tokenizer_sha256")
    mismatches = _mismatches(meta, current)
    result["mismatches"] = mismatches
    if mismatches and not spec.allow_mismatch:
        raise WorkerError("mismatch", "; ".join(mismatches) + "; refusing to score it (pass --allow-mismatch to evaluate anyway)")
    if spec.train_py:
        model = load_kit_model(Path(spec.train_py), checkpoint, device)
    else:
        model = build_trnf_model(config, state, device)
        del state
    if not isinstance(model, torch.nn.Module):
        raise WorkerError("contract", f"the loader returned {type(model).__name__}, not a torch.nn.Module")
    model.eval()
    result["load_seconds"] = time.perf_counter() - started
    num_params = getattr(model, "num_params", None)
    result["params"] = int(num_params()) if callable(num_params) else sum(p.numel() for p in model.parameters())
    result["dtype"] = str(next((p.dtype for p in model.parameters()), torch.float32)).removeprefix("torch.")

    vocab_size = tokenizer.get_vocab_size()
    seq_len = int(spec.seq_len)
    batch_size = int(spec.batch_size)
    try:
        # Called the way the kit's train.py calls them (prepare_calls): positionally, and
        # with only the keywords the trusted file's signature accepts.
        result["causality"] = prepare_calls.causality_check(prepare, model, tokenizer, batch_size, seq_len, device)
        result["batch_independence"] = batch_independence_check(model, vocab_size, seq_len, device)
        score = prepare_calls.evaluate_bpb(
            prepare, model, tokenizer, batch_size, seq_len, device,
            split="public_val", max_tokens=int(spec.tokens), timeout_seconds=float(spec.timeout),
        )
    except prepare_calls.PrepareRejected as exc:
        raise WorkerError("prepare", str(exc)) from None
    except torch.cuda.OutOfMemoryError:
        raise WorkerError("memory", f"out of device memory at --batch-size {spec.batch_size}; try a smaller --batch-size") from None
    except WorkerError:
        raise
    except Exception as exc:
        raise WorkerError("eval", f"the model failed under evaluation: {_one_line(exc)}") from None
    result.update(score)

    if spec.sample_tokens and distributed.dist_info().is_main:
        result["samples"] = _samples(spec, model, tokenizer, seq_len, device)
    if spec.core is not None:
        scorer = _through_inference_py(spec, checkpoint, device) if spec.inference_py else model
        result["core"] = _core(spec, scorer, tokenizer, device)
        if spec.inference_py:
            result["core"]["through"] = f"inference.py ({spec.inference_py})"
    return result


def _through_inference_py(spec: WorkerSpec, checkpoint: Path, device: torch.device) -> Any:
    """The checkpoint loaded through inference.py, speaking CORE's scoring protocol; a trnf
    checkpoint has no train.py beside it: its load_for_eval is ``runtime.checkpoint``'s."""
    from trnfrontier.contract.inference import InferenceError, load_inference
    from trnfrontier.runtime import checkpoint as trnf_checkpoint

    train_module = None if spec.train_py else trnf_checkpoint
    try:
        return load_inference(Path(spec.inference_py or ""), checkpoint, device, train_module=train_module)
    except InferenceError as exc:
        raise WorkerError("load", str(exc)) from None
    except Exception as exc:
        raise _explain_load_failure(f"{spec.inference_py}:load_model({checkpoint})", exc) from None


def _samples(spec: WorkerSpec, model: torch.nn.Module, tokenizer: Any, seq_len: int, device: torch.device) -> list[dict[str, Any]]:
    prompt_ids = tokenizer.encode(spec.prompt or "", prepend=tokenizer.get_bos_token_id())
    generator = torch.Generator().manual_seed(spec.seed)
    samples = []
    for temperature in (0.0, float(spec.temperature)):
        ids = generate(model, prompt_ids, spec.sample_tokens, seq_len, device, temperature, generator)
        samples.append({"temperature": temperature, "text": tokenizer.decode(ids)})
    return samples


def _check_core(spec: WorkerSpec, tokenizer: Any) -> None:
    from trnfrontier.evaluate.core.run import check_job

    try:
        check_job(spec.core or {}, tokenizer)
    except TrnfError as exc:
        raise WorkerError("core", f"CORE: {exc}") from None


def _core(spec: WorkerSpec, model: Any, tokenizer: Any, device: torch.device) -> dict[str, Any]:
    """CORE on the bundle the parent checked; rank 0 reports progress for all ranks."""
    from trnfrontier.evaluate.core.run import run_job

    info = distributed.dist_info()
    progress = FileSteps(spec.progress_file, scale=info.world_size) if spec.progress_file and info.is_main else Steps.none()
    try:
        return run_job(spec.core or {}, model, tokenizer, device, progress)
    except TrnfError as exc:
        raise WorkerError("core", f"CORE: {exc}") from None
    except torch.cuda.OutOfMemoryError:
        raise WorkerError("memory", _core_memory_advice((spec.core or {}).get("batch_tokens"))) from None
    except Exception as exc:
        raise WorkerError("eval", f"the model failed under CORE: {_one_line(exc)}") from None


def _core_memory_advice(batch_tokens: int | None) -> str:
    """What to do when CORE's batches do not fit: a smaller budget (the verdicts stay)."""
    from trnfrontier.evaluate.core.job import BATCH_TOKENS_FLAG, DEFAULT_BATCH_TOKENS

    tokens = int(batch_tokens or DEFAULT_BATCH_TOKENS)
    return (
        f"out of device memory under CORE at {tokens:,} padded tokens per forward; "
        f"rerun `trnf eval ... --core {BATCH_TOKENS_FLAG} {max(1, tokens // 4)}` (the verdicts do not change)"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # stdout is the JSON channel: route every print of the model's own code to stderr.
    json_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    code = 0
    try:
        if len(args) != 1:
            raise WorkerError("usage", "usage: python -m trnfrontier.evaluate.worker '<spec JSON>'")
        try:
            spec = WorkerSpec.from_json(args[0])
        except (ValueError, TypeError) as exc:
            raise WorkerError("usage", f"bad worker spec: {exc}") from None
        result = run(spec)
    except WorkerError as exc:
        result, code = {"error": str(exc), "error_kind": exc.kind}, 1
    except TrnfError as exc:
        result, code = {"error": str(exc), "error_kind": "contract"}, 1
    finally:
        distributed.shutdown()
    # Under torchrun rank 0 reports; another rank only its own failure (torchrun then
    # stops the rest, so that line is the last the parent reads).
    if code or distributed.dist_info().is_main:
        json_out.write(json.dumps(result, default=str) + "\n")
        json_out.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
