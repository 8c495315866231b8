"""Phase 2's combined score (`trnf runs score --pool FILE`): min-max normalised val_bpb and
CORE over the finalists' pool and the run, directions aligned, half each, and a rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from tests.ledger.fake_runs import make_run
from tests.ledger.test_ledger_core import score_core
from trnfrontier.errors import UsageError
from trnfrontier.ledger.combined import Entry, combined_scores, place, read_pool

POOL = [Entry("a", {"val_bpb": 0.90, "core": 0.20}), Entry("b", {"val_bpb": 0.95, "core": 0.30}), Entry("c", {"val_bpb": 1.00, "core": 0.10})]


def test_a_run_is_normalised_and_ranked_among_the_pool() -> None:
    placed = place(Entry("mine", {"val_bpb": 0.92, "core": 0.25}), POOL)
    assert placed.normalised == pytest.approx({"val_bpb": 0.8, "core": 0.75})  # (1.00 - 0.92) / 0.10, (0.25 - 0.10) / 0.20
    assert placed.combined == pytest.approx(0.775) and (placed.rank, placed.of) == (1, 4)
    assert combined_scores([*POOL]) == pytest.approx([0.75, 0.75, 0.0])


def test_directions_are_aligned_lower_bpb_and_higher_core_win() -> None:
    better_bpb = place(Entry("x", {"val_bpb": 0.85, "core": 0.10}), POOL)
    better_core = place(Entry("y", {"val_bpb": 1.00, "core": 0.40}), POOL)
    assert better_bpb.normalised["val_bpb"] == 1.0 and better_core.normalised["core"] == 1.0
    assert better_bpb.normalised["core"] == 0.0 and better_core.normalised["val_bpb"] == 0.0
    worst = place(Entry("z", {"val_bpb": 1.10, "core": 0.0}), POOL)
    assert worst.combined == 0.0 and worst.rank == 4


def test_a_metric_everyone_ties_on_separates_no_one() -> None:
    flat = [Entry("p", {"val_bpb": 1.0, "core": 0.2}), Entry("q", {"val_bpb": 1.0, "core": 0.3})]
    assert combined_scores(flat) == pytest.approx([0.5, 1.0])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "neither JSON nor CSV"),
        ("[", "not valid JSON"),
        ('{"teams": []}', "expected a list of entries"),
        ("[]", "no entries"),
        ('[{"name": "a", "val_bpb": 0.9}]', r"entry 1 \(a\): core is missing"),
        ('[{"name": "a", "val_bpb": "fast", "core": 0.2}]', "val_bpb is 'fast', not a number"),
        ('[{"name": "a", "val_bpb": NaN, "core": 0.2}]', "not a finite number"),
        ('[{"val_bpb": 0.9, "core": 0.2}]', "entry 1: no name"),
        ('[{"name": "a", "val_bpb": 0.9, "core": 0.2}, {"name": "a", "val_bpb": 1, "core": 0.1}]', "'a' appears twice"),
        ("name,val_bpb,core\na,0.9,\n", r"line 2 \(a\): core is missing"),
    ],
)
def test_a_bad_pool_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pool"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as caught:
        read_pool(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_json_and_csv_pools_read_the_same(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps({"entries": [{"name": "a", "val_bpb": 0.9, "core": 0.2}]}))
    (tmp_path / "p.csv").write_text("name, val_bpb, core\na,0.9,0.2\n")
    assert read_pool(tmp_path / "p.json") == read_pool(tmp_path / "p.csv") == [Entry("a", {"val_bpb": 0.9, "core": 0.2})]


def test_runs_score_places_each_local_run_against_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("TRNF_LEDGER", str(tmp_path / "ledger.sqlite"))
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    good, weak = make_run(runs, "good", 0.85), make_run(runs, "weak", 1.2, overrides=["optim.matrix_lr=0.03"])
    make_run(runs, "unscored", 0.9, overrides=["optim.matrix_lr=0.05"])
    score_core(good, 0.35)
    score_core(weak, 0.05)
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps([{"name": e.name, **e.values} for e in POOL]))
    assert run_cli(["runs", "rebuild", str(runs)], capsys)[0] == 0
    code, out, err = run_cli(["runs", "score", "--pool", str(pool), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert [(r["name"], r["rank"], r["of"]) for r in doc["runs"]] == [("good", 1, 4), ("weak", 4, 4)]
    assert doc["runs"][0]["combined"] == 1.0 and doc["runs"][1]["combined"] == 0.0
    assert any(note.startswith("unscored: no core") for note in doc["notes"])
    code, out, _ = run_cli(["runs", "score", "--pool", str(pool)], capsys)
    assert code == 0 and "1 of 4" in out
    pool.write_text("[{]")
    code, _, err = run_cli(["runs", "score", "--pool", str(pool)], capsys)
    assert code == 2 and err.count("trnf: error:") == 1 and "not valid JSON" in err
