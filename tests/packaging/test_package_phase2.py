"""trnf package for a Phase 2 run: its phase's launch shapes and budget, inference.py shipped,
the phase in the manifest; Phase 1 archives unchanged (tests/packaging/test_package.py)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.verify import verify_kit
from trnfrontier import submission as fmt
from trnfrontier.contract.inference_source import inference_py_source
from trnfrontier.contract.launch import launch_line
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.packaging.build import package_run

SERVER_LAUNCH = launch_line(64, 2)


def _as_phase_2(run: Path) -> Path:
    recipe = json.loads((run / "recipe.json").read_text())
    (run / "recipe.json").write_text(json.dumps({**recipe, "phase": 2}))
    return run


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_phase_2_archive_carries_inference_py_and_its_phase(run_copy: Path, tmp_path: Path) -> None:
    result = package_run(_as_phase_2(run_copy), tmp_path / "s.tar", launch=SERVER_LAUNCH)
    members = _members(tmp_path / "s.tar")
    assert members[fmt.INFERENCE_PY].decode() == inference_py_source()
    assert members[fmt.LAUNCH_FILE].decode().strip() == SERVER_LAUNCH
    assert result.manifest["phase"] == 2 and fmt.INFERENCE_PY in result.manifest["files"]


def test_phase_1_archive_names_no_phase(tiny_run: Path, tmp_path: Path) -> None:
    result = package_run(tiny_run, tmp_path / "s.tar")
    assert "phase" not in result.manifest and fmt.INFERENCE_PY not in result.manifest["files"]


def test_a_rehearsal_at_another_scale_needs_the_servers_launch(run_copy: Path, tmp_path: Path) -> None:
    run = _as_phase_2(run_copy)
    with pytest.raises(TrnfError, match=r"runtime.nproc=1 with LNC 2 is not a Phase 2 launch .*give --launch"):
        package_run(run, tmp_path / "s.tar")
    with pytest.raises(UsageError, match="must be --nproc_per_node=64 or 128"):
        package_run(run, tmp_path / "s.tar", launch=launch_line(4, 2))
    assert not (tmp_path / "s.tar").exists()


def test_the_batch_must_divide_across_the_declared_launch(run_copy: Path, tmp_path: Path) -> None:
    run = _as_phase_2(run_copy)
    recipe = json.loads((run / "recipe.json").read_text())
    recipe["data"]["total_batch_tokens"] = 4 * 32 * 8  # 8 micro-batches: not a multiple of 64 ranks
    (run / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(UsageError, match="does not divide across 64 processes"):
        package_run(run, tmp_path / "s.tar", launch=SERVER_LAUNCH)


def test_a_four_hour_charge_is_within_phase_2_only(run_copy: Path, tmp_path: Path) -> None:
    """The trusted prepare.py knows Phase 1's 1,800 s; a Phase 2 run is held to 14,400."""
    (run_copy / "step_boundaries.jsonl").write_text(verify_kit.step_log([20.0, 30.0, 40.0, 50.0, 60.0, 1000.0, 9000.0]))
    with pytest.raises(TrnfError, match="over budget by prepare.budget_accounting"):
        package_run(run_copy, tmp_path / "one.tar")
    package_run(_as_phase_2(run_copy), tmp_path / "two.tar", launch=SERVER_LAUNCH)
