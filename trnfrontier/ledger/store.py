"""The SQLite ledger: an index of run directories under the data home.

``$TRNF_LEDGER``, else ``$TRNF_HOME/ledger.sqlite``. Every row comes from files in a run
directory (``reader.read_run``), so a lost or damaged ledger is rebuilt from them and a
run is (re)indexed by replacing all its rows in one transaction. A rebuild writes a new
file beside the old one and renames it into place: a reader never sees half a ledger.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trnfrontier.errors import TrnfError
from trnfrontier.ledger.reader import RunEntry
from trnfrontier.runtime.data_home import data_home

LEDGER_ENV = "TRNF_LEDGER"
SCHEMA_VERSION = 1
# Columns of the runs table, in order; JSON columns hold lists or objects.
RUN_COLUMNS = (
    "run_dir", "name", "recipe", "recipe_ref", "recipe_key", "overrides", "parent", "seed",
    "git_commit", "git_dirty", "git_repo", "prepare_sha256", "tokenizer_sha256", "dataset",
    "data_id", "device", "world_size", "lnc", "env", "status", "steps", "tokens",
    "tokens_per_second", "charged_seconds", "params", "final_loss", "created", "finished",
    "recipe_json", "speed_env", "sweep", "sweep_params",
)  # fmt: skip
SCORE_COLUMNS = (
    "run_dir", "source", "val_bpb", "num_tokens", "counted_tokens", "num_bytes", "seq_len", "split",
    "prepare_sha256", "tokenizer_sha256", "dataset", "data_id", "status", "recorded",
    "core", "core_bundle_sha256", "core_max_per_task", "core_crop",
)  # fmt: skip
OFFICIAL_COLUMNS = ("run_dir", "official", "local_val_bpb", "local_num_tokens", "local_seq_len", "note", "recorded")
JSON_COLUMNS = ("overrides", "env", "recipe_json", "speed_env", "sweep_params")
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs ({", ".join(c + (" TEXT PRIMARY KEY" if c == "run_dir" else "") for c in RUN_COLUMNS)});
CREATE TABLE IF NOT EXISTS scores ({", ".join(SCORE_COLUMNS)});
CREATE TABLE IF NOT EXISTS official ({", ".join(OFFICIAL_COLUMNS)});
CREATE INDEX IF NOT EXISTS scores_run ON scores (run_dir);
CREATE INDEX IF NOT EXISTS official_run ON official (run_dir);
"""


def ledger_path() -> Path:
    chosen = os.environ.get(LEDGER_ENV)
    if chosen:
        return Path(chosen).expanduser()
    return data_home() / "ledger.sqlite"


class Ledger:
    """An open ledger. Use as a context manager; every write is its own transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, timeout=30.0)
            self.db.row_factory = sqlite3.Row
            self.db.executescript(SCHEMA)
            self._add_missing_columns()
            self.db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
            )
            self.db.commit()
            (version,) = self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise TrnfError(
                f"ledger {path} is unreadable ({exc}); rebuild it from the run directories with "
                "`trnf runs rebuild runs/`"
            ) from None
        except OSError as exc:
            raise TrnfError(f"ledger {path}: {exc}; set TRNF_LEDGER or --home to a writable place") from None
        if version != str(SCHEMA_VERSION):
            self.db.close()
            raise TrnfError(
                f"ledger {path} has schema {version}, this trnf writes {SCHEMA_VERSION}; "
                "rebuild it from the run directories with `trnf runs rebuild runs/`"
            )

    def _add_missing_columns(self) -> None:
        """A ledger written by an older trnf lacks columns added since (new columns only
        ever come at the end): added empty, so its rows read as "not recorded" until the
        run is indexed again (`trnf runs rebuild` fills them from the run directories)."""
        tables = {"runs": RUN_COLUMNS, "scores": SCORE_COLUMNS, "official": OFFICIAL_COLUMNS}
        for table, columns in tables.items():
            present = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}  # noqa: S608 - fixed names
            for column in columns:
                if column not in present:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")  # noqa: S608 - fixed names

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.close()

    # ------------------------------------------------------------------ writing

    def put(self, *entries: RunEntry) -> None:
        """Replace every row of each run with its entry's, all in one transaction (one
        sync to disk however many runs: a rebuild of hundreds stays quick)."""
        with self.db:
            for entry in entries:
                run = {**entry.run, "recipe_json": entry.recipe}
                key = run["run_dir"]
                for table in ("runs", "scores", "official"):
                    self.db.execute(f"DELETE FROM {table} WHERE run_dir = ?", (key,))  # noqa: S608 - fixed names
                self._insert("runs", RUN_COLUMNS, [run])
                self._insert("scores", SCORE_COLUMNS, [{**s, "run_dir": key} for s in entry.scores])
                self._insert("official", OFFICIAL_COLUMNS, [{**o, "run_dir": key} for o in entry.official])

    def _insert(self, table: str, columns: tuple[str, ...], rows: Iterable[dict[str, Any]]) -> None:
        marks = ", ".join("?" for _ in columns)
        self.db.executemany(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",  # noqa: S608 - fixed names
            [tuple(_encode(column, row.get(column)) for column in columns) for row in rows],
        )

    def forget(self, run_dir: str) -> None:
        with self.db:
            for table in ("runs", "scores", "official"):
                self.db.execute(f"DELETE FROM {table} WHERE run_dir = ?", (run_dir,))  # noqa: S608

    # ------------------------------------------------------------------ reading

    def runs(self) -> list[dict[str, Any]]:
        """Every run, oldest first, each with its ``scores`` and ``official`` lists."""
        runs = [_decode(row) for row in self.db.execute("SELECT * FROM runs ORDER BY created, run_dir")]
        scores = self._grouped("SELECT * FROM scores ORDER BY recorded")
        official = self._grouped("SELECT * FROM official ORDER BY recorded")
        for run in runs:
            run["scores"] = scores.get(run["run_dir"], [])
            run["official"] = official.get(run["run_dir"], [])
        return runs

    def _grouped(self, query: str) -> dict[str, list[dict[str, Any]]]:
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in self.db.execute(query):
            record = dict(row)
            grouped.setdefault(record.pop("run_dir"), []).append(record)
        return grouped


def _encode(column: str, value: Any) -> Any:
    if column in JSON_COLUMNS:
        return json.dumps(value, sort_keys=True)
    if isinstance(value, bool):
        return int(value)
    return value


def _decode(row: sqlite3.Row) -> dict[str, Any]:
    record = dict(row)
    for column in JSON_COLUMNS:
        if record.get(column) is not None:
            record[column] = json.loads(record[column])
    if record.get("git_dirty") is not None:
        record["git_dirty"] = bool(record["git_dirty"])
    return record


def open_ledger(path: Path | None = None) -> Ledger:
    return Ledger(path or ledger_path())


def rebuild(entries: Iterable[RunEntry], path: Path | None = None) -> int:
    """Write a fresh ledger holding exactly ``entries`` and swap it in; returns the count."""
    target = path or ledger_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    temporary.unlink(missing_ok=True)
    chosen = list(entries)
    try:
        with Ledger(temporary) as fresh:
            fresh.put(*chosen)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return len(chosen)
