"""The probe a verify subprocess runs: import the archive's train.py, call load_for_eval, judge the model.

This file is run as a script (``python -I probe.py ...``), never imported by the tool,
and must work in the organisers' environment: standard library, torch and the trusted
prepare.py only (the dry run executes it inside the clean environment). It writes one
JSON object to ``--out``; a crash or a timeout leaves no file, and the parent says so.

Modes:
  contract  causal, batch-independent, deterministic, eval mode, no hooks, finite logits
  eval      the trusted ``prepare.evaluate_bpb`` on the claimed split and length
  load      load_for_eval and one finite forward (the dry run's last step)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import traceback


def _prepare_calls():
    """trnf's adapter for calls into prepare.py, loaded by path (trnfrontier may not be
    importable here: the dry run's clean environment has only the organisers' packages)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "prepare_calls.py")
    spec = importlib.util.spec_from_file_location("trnf_prepare_calls", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _load_prepare(path: str | None):
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("prepare", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["prepare"] = module  # `import prepare` in train.py gets the trusted file
    spec.loader.exec_module(module)
    return module


def _load_model(train_py: str, checkpoint: str):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(train_py)))
    spec = importlib.util.spec_from_file_location("train", train_py)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train"] = module
    spec.loader.exec_module(module)
    model = module.load_for_eval(checkpoint, torch.device("cpu"))
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"load_for_eval returned {type(model).__name__}, not an nn.Module")
    return model


def _logits(model, idx):
    out = model(idx)
    if isinstance(out, dict):
        out = out.get("logits")
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.float()


def _hooks(model) -> list[str]:
    from torch.nn.modules import module as nn_module

    found = []
    for name, sub in model.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if getattr(sub, attr, None):
                found.append(f"{attr.strip('_')} on {name or 'the model'}")
    for attr in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks"):
        if getattr(nn_module, attr, None):
            found.append(f"a global {attr.strip('_')[7:]}")
    return found


def contract(model, prepare, vocab: int, seq_len: int) -> dict:
    import torch

    result = {"checks": {}}
    checks = result["checks"]
    hooks = _hooks(model)
    checks["hooks"] = {"passed": not hooks, "detail": "; ".join(hooks) or "no hooks"}
    training = [n or "the model" for n, m in model.named_modules() if m.training]
    checks["eval_mode"] = {"passed": not training, "detail": f"in training mode: {', '.join(training[:3])}" if training else "eval mode"}
    gen = torch.Generator().manual_seed(1234)
    batch = 4
    x = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    with torch.no_grad():
        y = _logits(model, x)
        if y.dim() != 3 or tuple(y.shape[:2]) != (batch, seq_len):
            raise ValueError(f"forward returned shape {tuple(y.shape)}, expected ({batch}, {seq_len}, vocab)")
        scale = max(1.0, float(y.abs().max()))
        tol = 1e-4 * scale
        checks["finite"] = {"passed": bool(torch.isfinite(y).all()), "detail": "logits are finite" if torch.isfinite(y).all() else "logits contain NaN or inf"}
        again = _logits(model, x)
        diff = float((again - y).abs().max())
        checks["deterministic"] = {"passed": diff <= tol, "detail": f"max |diff| between two identical forwards {diff:.3g}"}
        worst = 0.0
        for i in range(batch):
            worst = max(worst, float((_logits(model, x[i : i + 1]) - y[i : i + 1]).abs().max()))
        shuffled = torch.cat([x.flip(0), torch.randint(0, vocab, (3, seq_len), generator=gen)])
        worst = max(worst, float((_logits(model, shuffled)[:batch].flip(0) - y).abs().max()))
        checks["batch_independent"] = {"passed": worst <= tol, "detail": f"max |diff| across batch sizes/compositions {worst:.3g}"}
        tokenizer = None
        if prepare is not None and callable(getattr(prepare, "causality_check", None)):
            try:  # the kit's causality_check takes the tokenizer, which needs the prepared data
                tokenizer = _prepare_calls().ensure_tokenizer(prepare)
            except Exception:  # no data here: the probe's own perturbation check below
                tokenizer = None
        if tokenizer is not None:
            res = _prepare_calls().causality_check(prepare, model, tokenizer, batch, seq_len, "cpu")
            checks["causal"] = {"passed": bool(res["passed"]), "detail": f"prepare.causality_check max_abs_diff {float(res['max_abs_diff']):.3g}"}
        else:
            worst = 0.0
            for cut in sorted({1, seq_len // 4, seq_len // 2, seq_len - 1}):
                changed = x.clone()
                changed[:, cut:] = torch.randint(0, vocab, (batch, seq_len - cut), generator=gen)
                worst = max(worst, float((_logits(model, changed)[:, :cut] - y[:, :cut]).abs().max()))
            checks["causal"] = {"passed": worst <= tol, "detail": f"max |diff| of earlier logits when later tokens change {worst:.3g}"}
    late = _hooks(model)
    if late and not hooks:
        checks["hooks"] = {"passed": False, "detail": "hooks registered during forward: " + "; ".join(late)}
    result["passed"] = all(c["passed"] for c in checks.values())
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["contract", "eval", "load"])
    parser.add_argument("--train-py", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--prepare")
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--eval-tokens", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    try:
        import torch

        torch.manual_seed(0)
        prepare = _load_prepare(args.prepare)
        vocab = int(getattr(prepare, "TOKENIZER_VOCAB_SIZE", args.vocab))
        model = _load_model(args.train_py, args.checkpoint)
        if args.mode == "contract":
            result = contract(model, prepare, vocab, args.seq_len)
        elif args.mode == "eval":
            calls = _prepare_calls()
            tokenizer = calls.ensure_tokenizer(prepare)
            with torch.no_grad():
                res = calls.evaluate_bpb(prepare, model, tokenizer, args.batch_size, args.seq_len, "cpu",
                                         split="public_val", max_tokens=args.eval_tokens)
            result = {"passed": True, "eval": {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in dict(res).items()}}
        else:
            with torch.no_grad():
                y = _logits(model, torch.zeros(1, 8, dtype=torch.long))
            result = {"passed": bool(torch.isfinite(y).all()), "detail": f"forward gives {tuple(y.shape)}"}
    except BaseException as exc:  # report the failure as data; the parent turns it into a check
        tail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        result = {"passed": False, "error": tail[:400]}
    with open(args.out, "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
