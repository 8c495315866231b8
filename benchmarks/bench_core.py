"""CORE: trnf's engine against nanochat's own ``evaluate_task``, same model, same bundle,
same process, rounds alternating.

The reference is nanochat's ``nanochat/core_eval.py`` from a source checkout
(``--nanochat DIR``, the commit pinned in benchmarks/requirements-bench.txt), called as
``scripts/base_eval.evaluate_core`` calls it: items shuffled with ``random.Random(1337)``,
then ``evaluate_task(model, tokenizer, items, device, task_meta)`` per task, one item per
forward. Both sides score the same model object (a trnf GPT: a trained run with ``--run``,
else a seeded random one of ``--depth``/``--width`` whose blocks are not the identity) with
``model.max_seq_len`` set to the crop length, so both crop alike.

Per task: every item's verdict from nanochat (``evaluate_example``) against trnf's, the
disagreements, and how many of them trnf counted as near-ties (a disagreement that is not
a near-tie is a bug). Speed: ``--rounds`` rounds, each timing nanochat's ``evaluate_task``
over every task and trnf's engine (render, tokenize, batch, score: what
``evaluate_core`` runs per task) with each lever added in turn:

- ``batched``: many items per forward grouped by length, any logits model (``LogitsScorer``);
- ``head_at_positions``: the lm head only where a token is scored (``GPT.logits_at``);
- ``shared_prefix``: each item's common prefix computed once, cut to the shortest in its
  batch (``GPT.logits_after_prefix``);
- ``ragged``: each item's whole prefix, no padding outside attention, only the scored
  positions through the last layer (``GPT.logits_ragged``): what ``trnf eval --core`` uses
  for a trnf GPT.

Both sides run under the glibc settings ``trnf eval --core`` starts its CPU worker with
(``runtime/host_memory.py``: freed blocks stay in the heap; the process restarts itself
with them, unless ``TRNF_HOST_MALLOC=system``); nanochat's time is faster under them too.
The order alternates between rounds (other processes' load hits both sides); each time is
wall-clock and process CPU time. Ratios nanochat / trnf per round (above 1: trnf is
faster), their median and range, and a log-scale 95% interval (``stats.ratio_interval``).
``--repeat N`` repeats each task's items N times (the format sample has 16-20 items per
task, real tasks 500-10,000; batches only fill with more); the few-shot draws still differ
per item. The load average is recorded before and after.

``--shots real-suite`` scores the same text with the real CORE suite's shape: one task per
entry of nanochat's core.yaml (22, ``REAL_SUITE``), each with that entry's task type and
few-shot count, its items those of a sample task of the same type (taken in turn). It is
still the format sample's text (short items, so a 10-shot prompt is ~10 sample items long),
but the real suite is mostly 10-shot, and shots are most of a prompt: the rows are as long
as the crop allows, as the real bundle's are, and multiple choice shares a long context.

    .venv/bin/python benchmarks/bench_core.py --nanochat /work/nanochat [--run runs/x] \\
        [--depth 2 --width 128] [--bundle sample] [--shots bundle|real-suite] [--repeat 6] \\
        [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trnfrontier.runtime import host_memory  # noqa: E402

LEVERS = ("batched", "head_at_positions", "shared_prefix", "ragged")

# nanochat's core.yaml (the DCLM paper's CORE suite): label, task type, num_fewshot.
REAL_SUITE = (
    ("hellaswag_zeroshot", "multiple_choice", 0), ("jeopardy", "language_modeling", 10),
    ("bigbench_qa_wikidata", "language_modeling", 10), ("arc_easy", "multiple_choice", 10),
    ("arc_challenge", "multiple_choice", 10), ("copa", "multiple_choice", 0),
    ("commonsense_qa", "multiple_choice", 10), ("piqa", "multiple_choice", 10),
    ("openbook_qa", "multiple_choice", 0), ("lambada_openai", "language_modeling", 0),
    ("hellaswag", "multiple_choice", 10), ("winograd", "schema", 0), ("winogrande", "schema", 0),
    ("bigbench_dyck_languages", "language_modeling", 10), ("agi_eval_lsat_ar", "multiple_choice", 3),
    ("bigbench_cs_algorithms", "language_modeling", 10), ("bigbench_operators", "language_modeling", 10),
    ("bigbench_repeat_copy_logic", "language_modeling", 10), ("squad", "language_modeling", 10),
    ("coqa", "language_modeling", 0), ("boolq", "multiple_choice", 10),
    ("bigbench_language_identification", "multiple_choice", 10),
)


def load_model(args: argparse.Namespace) -> tuple[torch.nn.Module, str]:
    """A trained run's final model, or a seeded random GPT whose blocks are not the identity."""
    from trnfrontier.runtime.checkpoint import build_model, read_model_file
    from trnfrontier.runtime.model import GPT, GPTConfig

    if args.run:
        config, state, _meta = read_model_file(Path(args.run))
        return build_model(config, state).eval(), f"trained run {args.run}"
    torch.manual_seed(args.seed)
    heads = max(1, args.width // 64)
    model = GPT(GPTConfig(vocab_size=8192, sequence_len=256, n_layer=args.depth, n_head=heads, n_kv_head=heads, n_embd=args.width))
    with torch.no_grad():
        for block in model.blocks:
            torch.nn.init.normal_(block.attn.c_proj.weight, std=0.02)
            torch.nn.init.normal_(block.mlp.c_proj.weight, std=0.02)
        torch.nn.init.normal_(model.lm_head.weight, std=0.05)
    return model.eval(), f"seeded random GPT (seed {args.seed})"


class NanochatTokenizer:
    """The shipped tokenizer as nanochat's core_eval calls one: ``tok(prompts, prepend=id)``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, prompts: Any, prepend: Any = None) -> Any:
        return self.tokenizer.encode(prompts, prepend=prepend)

    def get_bos_token_id(self) -> int:
        return int(self.tokenizer.get_bos_token_id())


def scorers(model: torch.nn.Module, levers: tuple[str, ...] = LEVERS) -> dict[str, tuple[Any, bool]]:
    from trnfrontier.evaluate.core.protocol import (
        LogitsScorer,
        PositionLogitsScorer,
        RaggedScorer,
        SharedPrefixScorer,
    )

    cpu = torch.device("cpu")
    every = {
        "batched": (LogitsScorer(model, cpu), False),
        "head_at_positions": (PositionLogitsScorer(model, cpu), False),
        "shared_prefix": (SharedPrefixScorer(model, cpu), True),
        "ragged": (RaggedScorer(model, cpu), True),
    }
    return {lever: every[lever] for lever in levers}


def ours(tasks: list[tuple[Any, list[dict[str, Any]]]], tokenizer: Any, scorer: Any, share: bool, crop: int) -> list[list[Any]]:
    """trnf's engine over every task: what ``evaluate_core`` runs per task, on one rank."""
    from trnfrontier.evaluate.core.engine import score_rows, task_rows
    from trnfrontier.evaluate.core.run import DEFAULT_BATCH_TOKENS
    from trnfrontier.evaluate.core.scoring import FLOAT32_TOLERANCE

    out = []
    for task, items in tasks:
        rows = task_rows(task, items, list(range(len(items))), tokenizer, crop)
        out.append(score_rows(scorer, rows, batch_tokens=DEFAULT_BATCH_TOKENS, tolerance=FLOAT32_TOLERANCE, share_prefixes=share))
    return out


def meta_of(task: Any) -> dict[str, Any]:
    return {"task_type": task.kind, "num_fewshot": task.num_fewshot, "continuation_delimiter": task.delimiter}


def verdict_of(nanochat: Any, index: int, model: Any, tokenizer: Any, items: list[dict[str, Any]], task: Any) -> bool:
    """nanochat's ``evaluate_example`` verdict, which must be a bool (not a tensor to coerce)."""
    verdict = nanochat.evaluate_example(index, model, NanochatTokenizer(tokenizer), items, torch.device("cpu"), meta_of(task))
    if not isinstance(verdict, bool):
        raise SystemExit(f"nanochat's evaluate_example returned {type(verdict).__name__}, not bool; is --nanochat the pinned commit?")
    return verdict


def agreement(nanochat: Any, model: Any, tokenizer: Any, tasks: list[tuple[Any, list[dict[str, Any]]]], crop: int,
              levers: tuple[str, ...] = LEVERS) -> dict[str, Any]:
    """Per task and lever: items, disagreements, near-ties, disagreements that are not near-ties."""
    reference = [[verdict_of(nanochat, i, model, tokenizer, items, task) for i in range(len(items))] for task, items in tasks]
    report: dict[str, Any] = {}
    for lever, (scorer, share) in scorers(model, levers).items():
        per_task = {}
        for (task, _items), expected, verdicts in zip(tasks, reference, ours(tasks, tokenizer, scorer, share, crop), strict=True):
            differ = [i for i, (a, b) in enumerate(zip(expected, verdicts, strict=True)) if a != b.correct]
            per_task[task.label] = {
                "items": len(expected),
                "agree": len(expected) - len(differ),
                "near_ties": sum(v.near_tie for v in verdicts),
                "unexplained": sum(not verdicts[i].near_tie for i in differ),
                "nanochat_accuracy": sum(expected) / len(expected),
            }
        report[lever] = per_task
    return report


def timed(run: Any) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def rounds(nanochat: Any, model: Any, tokenizer: Any, tasks: list[tuple[Any, list[dict[str, Any]]]], crop: int, count: int,
           levers: tuple[str, ...] = LEVERS) -> dict[str, list[dict[str, float]]]:
    """Each side's times per round, the order reversed every other round."""
    ntok = NanochatTokenizer(tokenizer)

    def reference() -> None:
        for task, items in tasks:
            nanochat.evaluate_task(model, ntok, items, torch.device("cpu"), meta_of(task))

    sides: dict[str, Any] = {"nanochat": reference}
    for lever, (scorer, share) in scorers(model, levers).items():
        sides[lever] = lambda scorer=scorer, share=share: ours(tasks, tokenizer, scorer, share, crop)
    times: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for number in range(count):
        order = list(sides) if number % 2 == 0 else list(reversed(sides))
        for name in order:
            times[name].append(timed(sides[name]))
        print(f"round {number + 1}/{count}: " + ", ".join(f"{n} {times[n][-1]['wall']:.1f} s" for n in sides), file=sys.stderr)
    return times


def ratios(times: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """nanochat / trnf per lever timed (every side of ``times`` but nanochat), wall and CPU: per
    round, median, range, 95% interval."""
    from trnfrontier import stats

    out: dict[str, Any] = {}
    for lever in (side for side in times if side != "nanochat"):
        out[lever] = {}
        for clock in ("wall", "cpu"):
            reference = [t[clock] for t in times["nanochat"]]
            mine = [t[clock] for t in times[lever]]
            per_round = [r / m for r, m in zip(reference, mine, strict=True)]
            entry: dict[str, Any] = {"per_round": per_round, "median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}
            if len(per_round) > 1:
                interval = stats.ratio_interval(mine, reference)
                entry["interval_95"] = [interval.low, interval.high]
            out[lever][clock] = entry
    return out


def setup(args: argparse.Namespace) -> tuple[Any, Any, torch.nn.Module, str, list[tuple[Any, list[dict[str, Any]]]], Any, int]:
    sys.path.insert(0, str(Path(args.nanochat).resolve()))
    from nanochat import core_eval

    from trnfrontier.evaluate.core import fetch, render
    from trnfrontier.runtime.prepare_loader import load_prepare

    prepare = load_prepare(REPO / "prepare.py")
    tokenizer = prepare.Tokenizer.from_pickle_bytes(prepare.read_tokenizer_artifact()[0])
    model, described = load_model(args)
    crop = args.crop or int(model.config.sequence_len)
    model.max_seq_len = crop  # nanochat crops at it; so does trnf (crop_length)
    resolved = fetch.resolve(args.bundle, args.bundle_sha256)
    chosen = real_suite(resolved.bundle.tasks) if args.shots == "real-suite" else [(task, task) for task in resolved.bundle.tasks]
    tasks = [(task, render.shuffled(resolved.bundle.items(source) * args.repeat, args.max_per_task)) for task, source in chosen]
    return core_eval, tokenizer, model, described, tasks, resolved, crop


def real_suite(sample: Any) -> list[tuple[Any, Any]]:
    """(task to score, bundle task whose items it scores): the real suite's 22 entries, each
    a bundle task of its type (in turn) with the entry's label and few-shot count."""
    by_kind: dict[str, list[Any]] = {}
    for task in sample:
        by_kind.setdefault(task.kind, []).append(task)
    used: dict[str, int] = {}
    out = []
    for label, kind, shots in REAL_SUITE:
        if kind not in by_kind:
            raise SystemExit(f"--shots real-suite needs a {kind} task in the bundle; it has none")
        source = by_kind[kind][used.get(kind, 0) % len(by_kind[kind])]
        used[kind] = used.get(kind, 0) + 1
        out.append((dataclasses.replace(source, label=f"{label} <- {source.label}", num_fewshot=shots), source))
    return out


def nanochat_commit(path: str) -> str | None:
    """The checkout's commit (``git rev-parse HEAD``), or None when it is no git checkout."""
    done = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def keep_freed_heap() -> None:
    """Run under the glibc settings ``trnf eval --core`` gives its CPU worker (host_memory),
    restarting this process with them once; both sides are timed under them."""
    wanted = host_memory.keep_freed_env("cpu")
    if wanted and not host_memory.kept():
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **wanted})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanochat", required=True, help="a nanochat source checkout (benchmarks/requirements-bench.txt)")
    parser.add_argument("--run", help="a trnf run directory or checkpoint (default: a seeded random GPT)")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bundle", default="sample")
    parser.add_argument("--bundle-sha256")
    parser.add_argument("--shots", choices=("bundle", "real-suite"), default="bundle",
                        help="bundle: its own tasks; real-suite: the real CORE suite's 22 task types and shot counts on its items")
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--max-per-task", type=int)
    parser.add_argument("--crop", type=int, help="default: the model's training context")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levers", default=",".join(LEVERS), help=f"comma-separated, of {', '.join(LEVERS)} (fewer: shorter runs)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/core_<date>.json")
    args = parser.parse_args(argv)
    levers = tuple(lever for lever in LEVERS if lever in args.levers.split(","))
    if not levers or set(args.levers.split(",")) - set(LEVERS):
        parser.error(f"--levers takes a comma-separated list of {', '.join(LEVERS)}")
    keep_freed_heap()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    load_before = os.getloadavg()
    core_eval, tokenizer, model, described, tasks, resolved, crop = setup(args)
    agree = agreement(core_eval, model, tokenizer, tasks, crop, levers)
    times = rounds(core_eval, model, tokenizer, tasks, crop, args.rounds, levers)
    document = {
        "benchmark": "bench_core",
        "date": datetime.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "nanochat_commit": nanochat_commit(args.nanochat),
        "host_malloc": "keep freed" if host_memory.kept() else "glibc defaults",
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "model": described,
                   "params": sum(p.numel() for p in model.parameters()), "crop": crop,
                   "bundle_sha256": resolved.sha256, "items": sum(len(items) for _task, items in tasks),
                   "tasks": {task.label: {"type": task.kind, "num_fewshot": task.num_fewshot, "items": len(items)} for task, items in tasks}},
        "agreement": agree,
        "times": times,
        "ratio_nanochat_over_trnf": ratios(times),
    }  # fmt: skip
    out = args.out or REPO / "benchmarks" / "results" / f"core_{document['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
