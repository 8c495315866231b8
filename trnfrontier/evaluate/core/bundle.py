"""A CORE bundle folder read into tasks and items, or one clear line saying what is wrong.

The format is nanochat's ``eval_bundle/`` (from the DCLM / llm-foundry ICL suite):

- ``core.yaml``: ``icl_tasks``, a list of tasks, each with ``label``, ``icl_task_type``
  (``multiple_choice``, ``schema`` or ``language_modeling``), ``dataset_uri`` (a path under
  ``eval_data/``), ``num_fewshot`` (a list; the first entry counts) and optionally
  ``continuation_delimiter`` (default one space); other keys are ignored, as nanochat does;
- ``eval_meta_data.csv``: ``Eval Task`` (a label) and ``Random baseline`` (percent);
- ``eval_data/<dataset_uri>``: JSON lines, one item each. Multiple choice: ``query``,
  ``choices``, ``gold``; schema: ``context_options``, ``continuation``, ``gold``; language
  modeling: ``context``, ``continuation``.

Anything nanochat would crash on, or would silently score as wrong (a missing field, a
``gold`` that indexes no option), is refused here with the file and line, before any
model work: a bad bundle never gives a smaller score.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trnfrontier.errors import TrnfError

CONFIG_FILE = "core.yaml"
META_FILE = "eval_meta_data.csv"
DATA_DIR = "eval_data"
TASK_TYPES = ("multiple_choice", "schema", "language_modeling")
DEFAULT_DELIMITER = " "
# The fields an item of each type must have; ``gold`` indexes the list-valued one.
ITEM_FIELDS = {
    "multiple_choice": ("query", "choices", "gold"),
    "schema": ("context_options", "continuation", "gold"),
    "language_modeling": ("context", "continuation"),
}
OPTIONS_FIELD = {"multiple_choice": "choices", "schema": "context_options"}


class BundleError(TrnfError):
    """The bundle is malformed; the message names the file (and line) and what to do."""


@dataclass(frozen=True)
class Task:
    """One ``icl_tasks`` entry with its random baseline (percent)."""

    label: str
    kind: str
    dataset_uri: str
    num_fewshot: int
    delimiter: str
    baseline: float


@dataclass(frozen=True)
class Bundle:
    """A bundle folder whose ``core.yaml`` and ``eval_meta_data.csv`` have been checked."""

    root: Path
    tasks: tuple[Task, ...]

    def data_path(self, task: Task) -> Path:
        return self.root / DATA_DIR / task.dataset_uri

    def origin(self, task: Task, position: int) -> str:
        """Where the task's item at file position ``position`` (0-based) is: ``file:line``
        (one item per line, no blank lines: ``read_items`` refuses them)."""
        return f"{_where(self.data_path(task), self.root)}:{position + 1}"

    def items(self, task: Task) -> list[dict[str, Any]]:
        """The task's items in file order, each checked against its type."""
        return read_items(self.data_path(task), task.kind, self.root)


def _where(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root.parent))
    except ValueError:
        return str(path)


def read_bundle(root: Path) -> Bundle:
    """Read ``root`` (the folder holding core.yaml); every task file must exist."""
    if not (root / CONFIG_FILE).is_file():
        raise BundleError(f"{root}: no {CONFIG_FILE}; a CORE bundle folder holds core.yaml, {META_FILE} and {DATA_DIR}/")
    baselines = read_baselines(root / META_FILE, root)
    entries = _task_entries(root / CONFIG_FILE, root)
    tasks, seen = [], set()
    for number, entry in enumerate(entries, start=1):
        task = _task(entry, number, baselines, root)
        if task.label in seen:
            raise BundleError(f"{_where(root / CONFIG_FILE, root)}: task {number}: label {task.label!r} appears twice; labels must be unique")
        seen.add(task.label)
        if not (root / DATA_DIR / task.dataset_uri).is_file():
            raise BundleError(
                f"{_where(root / DATA_DIR / task.dataset_uri, root)}: missing; core.yaml task {task.label!r} names it as its dataset_uri"
            )
        tasks.append(task)
    if not tasks:
        raise BundleError(f"{_where(root / CONFIG_FILE, root)}: icl_tasks is empty; there is nothing to score")
    return Bundle(root=root, tasks=tuple(tasks))


def _task_entries(path: Path, root: Path) -> list[Any]:
    import yaml

    where = _where(path, root)
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise BundleError(f"{where}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BundleError(f"{where}{line}: not valid YAML ({problem})") from None
    if not isinstance(config, dict) or not isinstance(config.get("icl_tasks"), list):
        raise BundleError(f"{where}: expected a mapping with an icl_tasks list")
    return config["icl_tasks"]


def _task(entry: Any, number: int, baselines: dict[str, float], root: Path) -> Task:
    where = f"{_where(root / CONFIG_FILE, root)}: task {number}"
    if not isinstance(entry, dict):
        raise BundleError(f"{where}: expected a mapping (label, icl_task_type, dataset_uri, num_fewshot)")
    for key in ("label", "icl_task_type", "dataset_uri", "num_fewshot"):
        if key not in entry:
            raise BundleError(f"{where}: no {key}")
    label = entry["label"]
    if not isinstance(label, str) or not label:
        raise BundleError(f"{where}: label must be a non-empty string")
    where = f"{where} ({label})"
    kind = entry["icl_task_type"]
    if kind not in TASK_TYPES:
        raise BundleError(f"{where}: unknown icl_task_type {kind!r}; CORE knows {', '.join(TASK_TYPES)}")
    shots = entry["num_fewshot"]
    if not isinstance(shots, list) or not shots or not _is_count(shots[0]):
        raise BundleError(f"{where}: num_fewshot must be a list whose first entry is a count >= 0, e.g. [0]")
    delimiter = entry.get("continuation_delimiter", DEFAULT_DELIMITER)
    if not isinstance(delimiter, str):
        raise BundleError(f"{where}: continuation_delimiter must be a string (quote it in the YAML)")
    uri = entry["dataset_uri"]
    if not isinstance(uri, str) or not _inside(uri):
        raise BundleError(f"{where}: dataset_uri {uri!r} must be a relative path inside {DATA_DIR}/")
    if label not in baselines:
        raise BundleError(f"{_where(root / META_FILE, root)}: no 'Eval Task' row for {label!r} (named in core.yaml); its random baseline is needed")
    return Task(label, kind, uri, int(shots[0]), delimiter, baselines[label])


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _inside(uri: str) -> bool:
    parts = PurePosixPath(uri).parts
    return bool(parts) and not uri.startswith(("/", "\\")) and ".." not in parts and "\\" not in uri and ":" not in parts[0]


def read_baselines(path: Path, root: Path) -> dict[str, float]:
    """``Eval Task`` -> ``Random baseline`` (percent), every row parsed as nanochat does."""
    where = _where(path, root)
    if not path.is_file():
        raise BundleError(f"{where}: missing; a CORE bundle needs the random baseline of every task")
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            for column in ("Eval Task", "Random baseline"):
                if column not in columns:
                    raise BundleError(f"{where}: no {column!r} column (found {', '.join(map(repr, columns)) or 'none'})")
            baselines = {}
            for row in reader:
                label, value = row["Eval Task"], row["Random baseline"]
                try:
                    number = float(value) if value is not None else math.nan
                except ValueError:
                    number = math.nan
                if not math.isfinite(number) or not 0 <= number < 100:
                    raise BundleError(f"{where}:{reader.line_num}: Random baseline {value!r} of {label!r} is not a percentage in [0, 100)")
                baselines[label] = number
    except UnicodeDecodeError:
        raise BundleError(f"{where}: not UTF-8 text") from None
    except csv.Error as exc:
        raise BundleError(f"{where}: not valid CSV ({exc})") from None
    return baselines


def read_items(path: Path, kind: str, root: Path) -> list[dict[str, Any]]:
    """Every line of a task file as an item; a bad line is refused as ``file:line``."""
    where = _where(path, root)
    items = []
    try:
        # Text mode with universal newlines, one item per line: as nanochat reads it.
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                items.append(_item(line, kind, f"{where}:{number}"))
    except UnicodeDecodeError:
        raise BundleError(f"{where}: not UTF-8 text") from None
    except OSError as exc:
        raise BundleError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    if not items:
        raise BundleError(f"{where}: no items")
    return items


def _item(line: str, kind: str, where: str) -> dict[str, Any]:
    if not line.strip():
        raise BundleError(f"{where}: empty line; every line of a task file is one JSON item")
    try:
        item = json.loads(line.strip())
    except json.JSONDecodeError as exc:
        raise BundleError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(item, dict):
        raise BundleError(f"{where}: expected a JSON object, got {type(item).__name__}")
    missing = [key for key in ITEM_FIELDS[kind] if key not in item]
    if missing:
        raise BundleError(f"{where}: a {kind} item needs {', '.join(ITEM_FIELDS[kind])}; {', '.join(missing)} missing")
    options = OPTIONS_FIELD.get(kind)
    if options is not None:
        if not isinstance(item[options], list) or not item[options]:
            raise BundleError(f"{where}: {options} must be a non-empty list")
        gold = item["gold"]
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(item[options]):
            raise BundleError(f"{where}: gold {gold!r} is not an index of its {len(item[options])} {options}")
    return item
