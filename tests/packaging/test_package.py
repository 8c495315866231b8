"""trnf package on a real tiny run: contents, determinism, refusals and --force, clean-environment load."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.packaging.conftest import edit_summary
from tests.verify import verify_kit
from trnfrontier import submission as fmt
from trnfrontier.errors import TrnfError
from trnfrontier.kit.harness import build_clean_env
from trnfrontier.packaging.build import package_run, screen_reasons
from trnfrontier.packaging.writeup import FACTS_MARKER
from trnfrontier.verify import Options, verify_archive

REPO = Path(__file__).resolve().parents[2]


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_archive_contents_and_manifest(tiny_run: Path, tmp_path: Path) -> None:
    result = package_run(tiny_run, tmp_path / "s.tar")
    members = _members(result.archive)
    for name in fmt.REQUIRED_MEMBERS + (
        fmt.LOSS_CURVE,
        "trnfrontier/runtime/trainer.py",
        "trnfrontier/__init__.py",
    ):
        assert name in members, name
    manifest = json.loads(members[fmt.MANIFEST])
    summary = json.loads((tiny_run / "summary.json").read_text())
    assert (
        manifest["claimed"]["val_bpb"] == summary["val_bpb"]
        and manifest["claimed"]["eval_tokens"] == 2048
    )
    assert manifest["params"] == summary["params"] and manifest["seed"] == 1337
    assert (
        manifest["prepare_sha256"] == summary["prepare_sha256"]
        and manifest["tokenizer_sha256"] == summary["tokenizer_sha256"]
    )
    assert set(manifest["versions"]) == {"python", "torch", "torch_neuronx", "trnf"} and set(
        manifest["git"]
    ) == {"commit", "dirty"}
    assert (
        members[fmt.LAUNCH_FILE].decode().strip()
        == manifest["launch"]
        == "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=1 train.py"
    )
    assert members[fmt.CHECKPOINT_FINAL_PT] == (tiny_run / "final" / "final.pt").read_bytes()
    assert members[fmt.LOSS_CURVE].startswith(b"\x89PNG\r\n\x1a\n")
    writeup = members[fmt.WRITEUP].decode()
    assert (
        "model.depth" in writeup
        and f"{summary['val_bpb']:.6f}" in writeup
        and "| steps | 4 |" in writeup
    )
    assert "nats/token at step 1 to" in writeup and "at step 4 (lowest" in writeup
    train_py = members[fmt.TRAIN_PY].decode()
    assert (
        "def load_for_eval(checkpoint_path" in train_py
        and "'max_steps': 4" in train_py
        and "TRNF_DRY_RUN_STEPS" in train_py
    )
    assert manifest["forced"] == [] and "Packaged with --force" not in writeup


def test_same_run_packaged_twice_is_byte_identical(tiny_run: Path, tmp_path: Path) -> None:
    first = package_run(tiny_run, tmp_path / "a.tar").archive.read_bytes()
    second = package_run(tiny_run, tmp_path / "b.tar").archive.read_bytes()
    assert first == second
    assert not list(tmp_path.glob("*.partial"))


def test_trnf_verify_passes_on_the_packaged_run(tiny_run: Path, tmp_path: Path) -> None:
    archive = package_run(tiny_run, tmp_path / "s.tar").archive
    with tarfile.open(archive) as tar:
        claim = json.loads(tar.extractfile("manifest.json").read())["claimed"]  # type: ignore[union-attr]
    # The rerun scores at the settings the run's evaluation used (the contract's are 2M tokens at 1024).
    report = verify_archive(archive, Options(rerun_eval=True, eval_tokens=claim["eval_tokens"], eval_seq_len=claim["eval_seq_len"]))
    assert report.ok, [(c.name, c.reason) for c in report.checks if not c.ok]
    assert {c.name for c in report.checks} >= {
        "screen",
        "checkpoint",
        "budget",
        "contract",
        "rerun-eval",
    } and not report.notes


def _extract(archive: Path, root: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
        return sorted(m.name for m in tar.getmembers())


@pytest.mark.slow
@pytest.mark.parametrize("single_file", [False, True], ids=["package", "single-file"])
def test_packaged_train_py_loads_its_checkpoint_without_trnf(
    tiny_run: Path, tmp_path: Path, single_file: bool
) -> None:
    archive = package_run(tiny_run, tmp_path / "s.tar", single_file=single_file).archive
    root = tmp_path / "x"
    _extract(archive, root)
    python = build_clean_env(tmp_path / "env", REPO / "prepare.py")
    probe = (
        "import importlib.util, sys, torch\n"
        "for name in ('pydantic', 'typer', 'rich', 'yaml'):\n"
        "    assert importlib.util.find_spec(name) is None, name\n"
        "import train\n"
        f"assert importlib.util.find_spec('trnfrontier') is None or importlib.util.find_spec('trnfrontier').origin.startswith({str(root)!r})\n"
        "m = train.load_for_eval('checkpoint/final.pt', torch.device('cpu'))\n"
        "y = m(torch.zeros(1, 8, dtype=torch.long))\n"
        "assert not m.training and y.shape[:2] == (1, 8) and bool(torch.isfinite(y).all())\n"
        "print('ok', sum(p.numel() for p in m.parameters()))\n"
    )
    done = subprocess.run(
        [str(python), "-I", "-c", f"import sys; sys.path.insert(0, {str(root)!r})\n" + probe],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [
        "ok",
        str(json.loads((tiny_run / "summary.json").read_text())["params"]),
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"over_budget": True, "charged_seconds": 1900.0}, "over budget"),
        ({"status": "diverged", "diverged_step": 3}, "status is 'diverged' at step 3"),
        ({"prepare_sha256": "0" * 64}, "prepare.py SHA256 0000000000000000... is not the pinned"),
    ],
)
def test_refusals_and_force(run_copy: Path, tmp_path: Path, changes: dict, message: str) -> None:
    edit_summary(run_copy, **changes)
    out = tmp_path / "s.tar"
    with pytest.raises(TrnfError, match="refusing to package") as refused:
        package_run(run_copy, out)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
    result = package_run(run_copy, out, force=True)
    forced = result.manifest["forced"]
    assert any(message in reason for reason in forced)
    assert message in _members(out)[fmt.WRITEUP].decode()


def test_over_budget_by_the_step_log_alone_is_refused(run_copy: Path, tmp_path: Path) -> None:
    (run_copy / "step_boundaries.jsonl").write_text(
        verify_kit.step_log([20.0, 30.0, 40.0, 50.0, 60.0, 1000.0, 2000.0])
    )
    with pytest.raises(TrnfError, match="over budget by prepare.budget_accounting"):
        package_run(run_copy, tmp_path / "s.tar")


def test_screen_reasons_are_verifys_findings(tmp_path: Path) -> None:
    """Packaging screens with verify's own screen: a non-UTF-8 helper is a finding, not a crash."""
    helper = tmp_path / "helper.py"
    helper.write_bytes(b"x = '\xff'\n")
    assert screen_reasons({"train.py": b"def load_for_eval(p, d):\n    return None\n", "helper.py": helper}) == [
        "static screen: helper.py: is not UTF-8 text"
    ]
    assert screen_reasons({"train.py": b"import socket\n"}) == [
        "static screen: train.py:1: imports socket (network or process use is not allowed)",
        "static screen: train.py: does not define load_for_eval(checkpoint_path, device)",
    ]


def test_no_final_checkpoint_is_refused_even_with_force(run_copy: Path, tmp_path: Path) -> None:
    (run_copy / "final" / "final.pt").unlink()
    with pytest.raises(TrnfError, match="no final checkpoint"):
        package_run(run_copy, tmp_path / "s.tar", force=True)


def test_writeup_merges_team_text(tiny_run: Path, tmp_path: Path) -> None:
    text = tmp_path / "mine.md"
    text.write_text(f"# Team Q\n\nWe used a smaller model.\n\n{FACTS_MARKER}\n\n## Thanks\n")
    writeup = _members(package_run(tiny_run, tmp_path / "s.tar", writeup=text).archive)[
        fmt.WRITEUP
    ].decode()
    assert writeup.startswith("# Team Q\n\nWe used a smaller model.") and writeup.rstrip().endswith(
        "## Thanks"
    )
    assert writeup.index("Run facts") < writeup.index("## Thanks") and FACTS_MARKER not in writeup


def test_single_file_is_one_code_file_under_the_limit(tiny_run: Path, tmp_path: Path) -> None:
    result = package_run(tiny_run, tmp_path / "s.tar", single_file=True)
    members = _members(result.archive)
    assert [n for n in members if n.endswith(".py")] == ["train.py"]
    source = members["train.py"]
    assert (
        len(source) <= fmt.PORTAL_FILE_LIMIT_BYTES
        and b"import trnfrontier" not in source
        and b"from trnfrontier" not in source
    )
    report = verify_archive(result.archive, Options())
    assert report.ok, [(c.name, c.reason) for c in report.checks if not c.ok]


@pytest.mark.slow
@pytest.mark.parametrize("single_file", [False, True], ids=["package", "single-file"])
def test_trnf_verify_dry_run_passes(tiny_run: Path, tmp_path: Path, single_file: bool) -> None:
    """verify --dry-run: its clean venv, torchrun, TRNF_DRY_RUN_STEPS, then load_for_eval without trnf."""
    archive = package_run(tiny_run, tmp_path / "s.tar", single_file=single_file).archive
    report = verify_archive(archive, Options(dry_run=True, dry_run_steps=2))
    assert report.ok, [(c.name, c.reason) for c in report.checks if not c.ok]
    assert "exited 0" in report.get("dry-run").reason


def _with_kernels(run: Path) -> Path:
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["kernels"]["relu2"] = "auto"
    (run / "recipe.json").write_text(json.dumps(recipe))
    return run


def test_recipe_kernels_ship_with_the_runtime_dispatch(run_copy: Path, tmp_path: Path) -> None:
    members = _members(package_run(_with_kernels(run_copy), tmp_path / "s.tar").archive)
    assert members["kernels/relu2.py"] == (REPO / "kernels" / "relu2.py").read_bytes()
    assert not [n for n in members if n.startswith("kernels/") and n != "kernels/relu2.py"]
    assert {
        "trnfrontier/runtime/kernels/__init__.py",
        "trnfrontier/runtime/kernels/select.py",
        "trnfrontier/runtime/kernels/backend.py",
    } <= set(members)
    assert "relu2" in members[fmt.WRITEUP].decode().split("NKI kernels |")[1].splitlines()[0]
    with pytest.raises(TrnfError, match="--single-file cannot inline NKI kernels"):
        package_run(run_copy, tmp_path / "t.tar", single_file=True)


@pytest.mark.slow
def test_kernel_recipe_dry_runs_on_cpu_with_the_reference_fallback(
    run_copy: Path, tmp_path: Path
) -> None:
    archive = package_run(_with_kernels(run_copy), tmp_path / "s.tar").archive
    report = verify_archive(archive, Options(dry_run=True, dry_run_steps=2))
    assert report.ok, [(c.name, c.reason) for c in report.checks if not c.ok]


def test_the_run_directorys_edited_writeup_is_packaged(run_copy: Path, tmp_path: Path) -> None:
    from trnfrontier.packaging.run_report import write_run_report

    write_run_report(run_copy)  # what `trnf train` leaves when the run finishes
    text = (run_copy / "WRITEUP.md").read_text()
    (run_copy / "WRITEUP.md").write_text(text.replace("_Describe the approach here (edit this file before submitting)._", "Smaller model, higher LR."))
    writeup = _members(package_run(run_copy, tmp_path / "s.tar").archive)[fmt.WRITEUP].decode()
    assert "Smaller model, higher LR." in writeup and writeup.count("## Run facts") == 1
    assert FACTS_MARKER not in writeup
