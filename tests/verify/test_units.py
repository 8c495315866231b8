"""Unit tests of the pieces: archive format, screen (no false positives), budget, pins, CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from verify_kit import GOOD_TIMES, build_archive, good_meta, pins_file, step_log

from trnfrontier import submission as fmt
from trnfrontier.contract.budget import documented_accounting
from trnfrontier.contract.pins import Pin, load_pins
from trnfrontier.runtime.prepare_loader import sha256_file
from trnfrontier.verify import Options, verify_archive
from trnfrontier.verify.screen import screen_source

REPO = Path(__file__).resolve().parents[2]


# -- archive format ---------------------------------------------------------------------

def test_deterministic_tar_is_byte_identical(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = build_archive(tmp_path / "a"), build_archive(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()


def test_deterministic_tar_sorts_and_zeroes_metadata(tmp_path: Path) -> None:
    import tarfile

    out = tmp_path / "x.tar"
    fmt.write_deterministic_tar({"b.py": b"b", "a.py": b"a", "kernels/k.py": b"k"}, out)
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["a.py", "b.py", "kernels/k.py"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
    assert not (tmp_path / "x.tar.partial").exists()


def test_build_manifest_refuses_foreign_members(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ValueError, match="secrets.txt"):
        fmt.build_manifest({"secrets.txt": tmp_path / "f"})
    manifest = fmt.build_manifest({"runtime/model.py": tmp_path / "f", "train.py": b"x"}, params=1)
    assert manifest["files"]["runtime/model.py"] == manifest["files"]["train.py"] == fmt.file_entry(tmp_path / "f")
    assert manifest["forced"] == [] and manifest["params"] == 1


@pytest.mark.parametrize("name,ok", [("train.py", True), ("runtime/gpt.py", True), ("kernels/relu2.py", True),
                                     ("checkpoint/evil.py", False), ("notes.txt", False), ("./train.py", False)])
def test_allowed_members(name: str, ok: bool) -> None:
    assert fmt.is_allowed_member(name) is ok


# -- screen: no false positives on what real submissions do -------------------------------

def test_screen_allows_kit_style_code() -> None:
    source = '''
import os, math, json, sys
import torch, numpy as np
import torch_neuronx, nki, nki.language as nl
from neuronxcc import nki as nki2
import prepare
from prepare import make_dataloader, evaluate_bpb, Tokenizer
from runtime.model import GPT
from . import sibling
loader = make_dataloader(None, 8, 1024, "train")
res = evaluate_bpb(model, tok, 8, split="public_val")
torch.compile(model)
model.eval()
x = prepare.TRAIN_TIME_BUDGET_SECONDS
sys.modules["runtime.model"] = GPT
def load_for_eval(checkpoint_path, device):
    return GPT()
'''
    result = screen_source(source, "train.py", {"runtime", "train"})
    assert result.findings == [] and result.defines_load_for_eval


@pytest.mark.parametrize("snippet,what", [
    ("from os import system", "os.system"),
    ("import urllib.request", "urllib"),
    ("import prepare\nprepare.Tokenizer.encode = None", "monkeypatching"),
    ("from prepare import evaluate_bpb\nevaluate_bpb.__defaults__ = ()", "monkeypatching"),
    ("import sys\nsys.modules['prepare'] = object()", "sys.modules"),
    ("import sys as s\ns.modules['prepare'] = object()", "sys.modules"),
    ("import prepare\nvars(prepare)['x'] = 1", "vars(prepare)"),
    ("exec('import socket')", "exec"),
    ("import importlib\nimportlib.import_module(name)", "computed module name"),
    ("import ctypes", "ctypes"),
    ("p = 'tokens/public_val_00000.bin'", "validation"),
    ("def f(:\n  pass", "does not parse"),
])
def test_screen_flags(snippet: str, what: str) -> None:
    findings = screen_source(snippet, "k.py", set()).findings
    assert findings and any(what in f.what for f in findings), findings


# -- budget ---------------------------------------------------------------------------------

@pytest.mark.parametrize("times", [GOOD_TIMES, [1.0, 2.0], [500.0, 950.0, 1000.0, 1100.0, 1200.0, 3000.0], []])
def test_documented_formula_matches_prepare(times: list[float], tmp_path: Path, prepare_module) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text(step_log([5.0, 6.0]) + step_log(times, start=5000.0))  # two runs: the last one counts
    ours = documented_accounting(log)
    theirs = prepare_module.budget_accounting(str(log))
    for key in ("charged_seconds", "startup_seconds", "over_budget", "steps", "headroom_seconds"):
        assert ours[key] == pytest.approx(theirs[key]), key
    assert set(ours) == set(theirs)  # callers read excluded_seconds, budget_seconds from either
    for key in theirs:
        assert ours[key] == pytest.approx(theirs[key]), key


# -- pins -------------------------------------------------------------------------------------

def test_default_pins_are_the_project_prepare_and_its_shipped_tokenizer(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "empty_home"))
    monkeypatch.delenv("TRNF_DATASET", raising=False)
    monkeypatch.delenv("TRNF_PREPARE", raising=False)
    pins = load_pins(None)
    assert pins.prepare.sha256 == sha256_file(REPO / "prepare.py")
    # No data prepared: the tokenizer is still pinned, by the artifact beside prepare.py.
    assert pins.tokenizer.sha256 == sha256_file(REPO / "artifacts" / "tokenizer.zip")
    meta = good_meta()
    meta["prepare_sha256"] = pins.prepare.sha256
    meta["tokenizer_sha256"] = pins.tokenizer.sha256
    (tmp_path / "w").mkdir()
    report = verify_archive(build_archive(tmp_path / "w", meta=meta))
    assert report.get("pin:prepare").verdict == "pass" and report.get("pin:tokenizer").verdict == "pass"


def test_without_an_artifact_or_data_the_tokenizer_pin_is_skipped(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "empty_home"))
    monkeypatch.delenv("TRNF_DATASET", raising=False)
    bare = tmp_path / "prepare.py"  # a prepare.py that ships no tokenizer artifact
    bare.write_text("TOKENIZER_VOCAB_SIZE = 8192\n")
    monkeypatch.setenv("TRNF_PREPARE", str(bare))
    pins = load_pins(None)
    assert pins.tokenizer.sha256 is None and "no prepared tokenizer" in pins.tokenizer.source
    meta = good_meta()
    meta["prepare_sha256"] = pins.prepare.sha256
    (tmp_path / "w").mkdir()
    report = verify_archive(build_archive(tmp_path / "w", meta=meta))
    assert report.get("pin:prepare").verdict == "pass"
    tokenizer = report.get("pin:tokenizer")
    assert tokenizer.verdict == "skip" and not tokenizer.required and tokenizer.ok
    assert report.ok, [c for c in report.checks if not c.ok]


def test_pin_matches_only_its_own_sha256() -> None:
    pin = Pin("ab" * 32, "test")
    assert pin.matches("ab" * 32) and pin.matches("AB" * 32)
    for other in ("ab" * 31, "cd" * 32, None, 0, ["ab" * 32], ""):
        assert not pin.matches(other), other
    assert not Pin(None, "nothing pinned").matches("ab" * 32)


def test_pins_file_in_trnf_home_is_used(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path))
    pins_file(tmp_path, prepare="c" * 64)
    assert load_pins(None).prepare.sha256 == "c" * 64


def test_default_tokenizer_pin_is_the_artifact_beside_prepare_py(sample_home: Path, prepare_module) -> None:
    pins = load_pins(None)
    assert pins.tokenizer.sha256 == prepare_module.TOKENIZER_ARTIFACT_SHA256
    assert pins.tokenizer.source.endswith("artifacts/tokenizer.zip")
    # The sample dataset is unpacked from that artifact, so its runs record the same pin.
    assert prepare_module.tokenizer_sha256() == pins.tokenizer.sha256


def test_without_an_artifact_the_pin_is_the_active_datasets(sample_home: Path, tmp_path: Path, monkeypatch) -> None:
    bare = tmp_path / "prepare.py"  # an organisers'-style prepare.py that ships no artifact
    bare.write_text("TOKENIZER_VOCAB_SIZE = 8192\n")
    monkeypatch.setenv("TRNF_PREPARE", str(bare))
    manifest = json.loads((sample_home / "datasets" / "sample" / "manifest.json").read_text())
    assert load_pins(None).tokenizer.sha256 == manifest["tokenizer"]["artifact_sha256"]


# -- docs ---------------------------------------------------------------------------------------

def test_the_docs_list_the_checks_in_the_order_verify_runs_them() -> None:
    """docs/ci.md's table of checks, top to bottom, is runner.CHECK_NAMES and then the optional ones."""
    import re

    from trnfrontier.verify.runner import CHECK_NAMES

    rows = re.findall(r"^\| `([a-z:-]+)`", (REPO / "docs" / "ci.md").read_text(encoding="utf-8"), flags=re.M)
    assert rows[: len(CHECK_NAMES) + 2] == [*CHECK_NAMES, "rerun-eval", "dry-run"]


# -- CLI ------------------------------------------------------------------------------------------

def _trnf(args: list[str], capsys) -> tuple[int, str, str]:
    from trnfrontier.cli.app import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return int(exit_info.value.code), captured.out, captured.err


def test_cli_json_and_exit_codes(tmp_path: Path, capsys) -> None:
    good = build_archive(tmp_path)
    pins = str(pins_file(tmp_path))
    code, out, _ = _trnf(["verify", str(good), "--json", "--pins", pins], capsys)
    document = json.loads(out)
    assert code == 0 and document["ok"] and {c["verdict"] for c in document["checks"]} == {"pass"}
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"nope")
    code, out, _ = _trnf(["verify", str(bad), "--json", "--pins", pins], capsys)
    assert code == 1 and json.loads(out)["checks"][0] == {"name": "extract", "verdict": "fail", "ok": False, "required": True,
                                                         "reason": json.loads(out)["checks"][0]["reason"]}
    code, out, err = _trnf(["verify", str(bad), "--pins", pins], capsys)
    # Not an archive at all: the one line that says so, not a table of checks that never ran.
    assert code == 1 and out == "" and "is not a submission archive" in err and "Traceback" not in err


def test_cli_usage_errors(tmp_path: Path, capsys) -> None:
    code, _, err = _trnf(["verify", str(tmp_path / "missing.tar")], capsys)
    assert code == 2 and "no such file" in err
    (tmp_path / "a.tar").write_bytes(b"x")
    code, _, err = _trnf(["verify", str(tmp_path / "a.tar"), "--pins", str(tmp_path / "nope.json")], capsys)
    assert code == 2 and "--pins" in err


def test_model_server_runs_without_the_tool() -> None:
    """modelserver.py runs in the sandbox and the clean environment: it must not import trnfrontier or the tool stack."""
    import ast

    source = (REPO / "trnfrontier" / "untrusted" / "modelserver.py").read_text()
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"torch", "numpy", "__future__"}  # the organisers' packages


# -- subprocess limits ------------------------------------------------------------------------

def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    from trnfrontier import processes

    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    done = processes.run_tree([sys.executable, "-c", script], cwd=tmp_path, timeout=3)
    assert done.timed_out
    grandchild = int(pid_file.read_text())
    stat = Path(f"/proc/{grandchild}/stat")
    # Gone, or a zombie waiting for its reaper: either way no longer running.
    assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z"


def test_hanging_load_for_eval_fails_the_contract_on_time(tmp_path: Path) -> None:
    from verify_kit import TRAIN_PY

    hanging = TRAIN_PY.replace("def load_for_eval(checkpoint_path, device):\n",
                               "def load_for_eval(checkpoint_path, device):\n    import time\n    time.sleep(600)\n")
    report = verify_archive(build_archive(tmp_path, train_py=hanging), Options(pins_file=pins_file(tmp_path), timeout=4))
    check = report.get("contract")
    assert check.verdict == "fail" and "timed out" in check.reason


@pytest.mark.parametrize("case", ["manifest-duplicate-params", "manifest-deep", "safetensors-deep-header", "summary-duplicate-key"])
def test_bad_json_is_one_clean_line_in_human_and_json_output(case: str, tmp_path: Path, capsys) -> None:
    from hostile import JSON, Ctx

    archive = JSON[case].build(Ctx(work=tmp_path, port=0, marker=tmp_path / "m", secret=""))
    args = ["verify", str(archive), "--pins", str(pins_file(tmp_path))]
    code, out, err = _trnf(args, capsys)
    assert code == 1 and "Traceback" not in out + err and "FAIL" in out
    assert "twice" in out or "nested" in out  # the table may wrap the reason between words
    code, out, err = _trnf([*args, "--json"], capsys)
    report = json.loads(out)
    reasons = " ".join(c["reason"] for c in report["checks"] if c["verdict"] == "fail")
    assert code == 1 and not report["ok"] and ("twice" in reasons or "nested too deeply" in reasons)


@pytest.mark.parametrize(("case", "says"), [("step-log-huge-integer-time", "field time"), ("manifest-5000-digit-seed", "field seed"),
                                            ("screen-finding-with-markup-and-escapes", "public_val [/]")])
def test_hostile_fields_are_one_refusal_in_human_and_json_output(case: str, says: str, tmp_path: Path, capsys) -> None:
    """Issue 25.5 and 26.6: no OverflowError, ValueError or rich MarkupError; the field is named, escapes never reach the terminal."""
    from hostile import HOSTILE, Ctx

    archive = HOSTILE[case].build(Ctx(work=tmp_path, port=0, marker=tmp_path / "m", secret=""))
    args = ["verify", str(archive), "--pins", str(pins_file(tmp_path))]
    code, out, err = _trnf(args, capsys)
    assert code == 1 and "Traceback" not in out + err and "FAIL" in out and "\x1b" not in out
    assert says in " ".join(out.split())
    code, out, err = _trnf([*args, "--json"], capsys)
    report = json.loads(out)
    reasons = " ".join(c["reason"] for c in report["checks"] if c["verdict"] == "fail")
    assert code == 1 and says in reasons and "\x1b" not in reasons
