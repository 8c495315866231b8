"""A non-editable install (`pip install .`, a wheel) has prepare.py, the recipes and the kernels.

The wheel is built from this checkout with hatchling (the project's build backend, a dev
dependency, so no network is needed), unpacked into an empty folder, and run from there
by an isolated interpreter in a folder away from the checkout: every file it finds must
come from inside the installed package.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import trnfrontier
from trnfrontier.trusted_prepare import default_prepare_path, tokenizer_sha256_of
from trnfrontier.recipes.registry import shipped_recipes
from trnfrontier.runtime.kernels.backend import kernels_dir
print(json.dumps({
    "package": trnfrontier.__file__,
    "prepare": str(default_prepare_path()),
    "tokenizer_pin": tokenizer_sha256_of(default_prepare_path())[0],
    "recipes": {name: str(path) for name, path in shipped_recipes().items()},
    "kernels": str(kernels_dir()),
}))
"""

_CLI = "import sys; sys.path.insert(0, sys.argv.pop(1)); from trnfrontier.cli.app import main; main(sys.argv[1:])"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="hatchling (the build backend, in the dev extra) builds the wheel")
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(REPO)],
        capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("trnfrontier-*.whl")
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_the_wheel_finds_its_own_prepare_recipes_and_kernels(installed: Path, tmp_path: Path) -> None:
    probe = subprocess.run([sys.executable, "-I", "-c", _PROBE, str(installed)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout)
    package = installed / "trnfrontier"
    assert Path(found["package"]).parent == package  # the wheel's copy, not the checkout
    assert Path(found["prepare"]) == package / "_shipped" / "prepare.py"
    # The tokenizer artifact travels beside prepare.py, so the wheel's prepare.py finds its pin.
    shipped = REPO / "artifacts" / "tokenizer.zip"
    assert (package / "_shipped" / "artifacts" / "tokenizer.zip").read_bytes() == shipped.read_bytes()
    assert found["tokenizer_pin"] == hashlib.sha256(shipped.read_bytes()).hexdigest()
    assert set(found["recipes"]) >= {"cpu_smoke", "baseline_d10", "muon_gqa"}
    assert all(Path(p).parent == package / "_shipped" / "recipes" for p in found["recipes"].values())
    assert Path(found["kernels"]) == package / "_shipped" / "kernels"
    assert (Path(found["kernels"]) / "relu2.py").is_file()


def test_trnf_recipes_list_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    listed = subprocess.run([sys.executable, "-I", "-c", _CLI, str(installed), "recipes", "list", "--json"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert listed.returncode == 0, listed.stderr[-3000:]
    names = {row["name"] for row in json.loads(listed.stdout)}
    assert names >= {"cpu_smoke", "baseline_d10", "muon_gqa"}
