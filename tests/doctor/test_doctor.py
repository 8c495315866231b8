"""`trnf doctor` on a CPU machine: each rung's decisions on faked devices, environments and
process tables, the ladder's order and what a CPU machine runs and names as skipped, and
the CLI with and without --kernels (the interpreter path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from trnfrontier.doctor import environment as envmod


def _trainium(tmp_path: Path, chips: int) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(chips):
        (dev / f"neuron{i}").touch()
    (dev / "neuron_stats").touch()  # not a device
    return dev


def test_parse_core_list() -> None:
    assert envmod.parse_core_list("0-3") == [0, 1, 2, 3]
    assert envmod.parse_core_list("4,5, 8-9") == [4, 5, 8, 9]


@pytest.mark.parametrize(
    ("chips", "lnc", "nproc", "env", "status", "text"),
    [
        (1, 2, 4, {}, "ok", "8 physical|4 logical at LNC=2 for nproc=4"),
        (1, 1, 8, {}, "ok", "8 logical at LNC=1 for nproc=8"),
        (1, 2, 8, {}, "fail", "4 logical at LNC=2, fewer than runtime.nproc=8"),
        (16, 2, 4, {}, "ok", "60 logical core\\(s\\) idle"),
        (16, 2, 4, {"NEURON_RT_VISIBLE_CORES": "0-3"}, "fail", "2 logical at LNC=2"),
        (1, 2, 4, {"NEURON_LOGICAL_NC_CONFIG": "1"}, "warn", "recipe says runtime.lnc=2"),
        (0, 2, 4, {}, "skip", "not a Trainium machine"),
    ],
)
def test_cores_against_lnc_and_nproc(
    tmp_path: Path, chips: int, lnc: int, nproc: int, env: dict, status: str, text: str
) -> None:
    check = envmod.check_cores(lnc, nproc, _trainium(tmp_path, chips), env)
    assert check.status == status
    said = f"{check.checked} {check.skipped}"
    assert any(__import__("re").search(t, said) for t in text.split("|"))


@pytest.mark.parametrize(
    ("flags", "status", "text"),
    [
        ("", "warn", "no --optlevel=1"),
        ("--optlevel=1", "ok", "--optlevel=1"),
        ("--optlevel 1 --model-type transformer", "ok", "--model-type"),
        ("-O1", "ok", "-O1"),
        ("--model-type=transformer", "warn", "half the training throughput"),
        ("--optlevel 2", "warn", "no --optlevel=1"),
        ("-O1 --target=trn1", "warn", "another chip"),
        ("-O1 --auto-cast-type fp8_e4m3", "warn", "FP8"),
        ("--optlevel 2 --optlevel 1", "warn", "given twice"),
        ("-O1 --logical-nc-config=2", "warn", "NEURON_LOGICAL_NC_CONFIG"),
        ("--flag 'unclosed", "fail", "does not parse"),
    ],
)
def test_neuron_cc_flags(flags: str, status: str, text: str) -> None:
    check = envmod.check_cc_flags({"NEURON_CC_FLAGS": flags} if flags else {})
    assert (check.status, text in check.checked) == (status, True), check


def test_neuron_cc_flags_off_trainium_say_what_they_would_do() -> None:
    check = envmod.check_cc_flags({}, on_trainium=False)
    assert check.status == "ok" and "on Trainium: no --optlevel=1" in check.checked
    assert "not a Trainium machine" in check.skipped


def test_compile_cache_location_and_free_disk(tmp_path: Path) -> None:
    env = {envmod.COMPILE_CACHE_ENV: str(tmp_path / "cache")}
    ok = envmod.check_compile_cache(env, min_free_gib=0.0)
    assert ok.status == "ok" and "created on first compile" in ok.checked
    low = envmod.check_compile_cache(env, min_free_gib=1e9)
    assert low.status == "warn" and envmod.COMPILE_CACHE_ENV in low.checked
    remote = envmod.check_compile_cache({envmod.COMPILE_CACHE_ENV: "s3://bucket/cache"})
    assert remote.status == "ok" and "remote" in remote.skipped
    flag = {"NEURON_CC_FLAGS": f"--cache_dir={tmp_path}/cc", envmod.COMPILE_CACHE_ENV: "/nope"}
    assert envmod.compile_cache_url(flag) == f"{tmp_path}/cc"  # the flag wins
    assert envmod.compile_cache_url({}) == "/var/tmp/neuron-compile-cache"


def test_versions_against_the_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    versions = {
        "torch": "2.9.1",
        "torch-neuronx": "2.9.0.2.11",
        "nki": "0.3.0",
        "neuronx-cc": "2.22",
    }
    monkeypatch.setattr(envmod, "_version", lambda name: versions.get(name))
    assert envmod.check_torch().status == "ok"
    assert envmod.check_torch_neuronx().status == "ok"
    assert envmod.check_nki_and_compiler().status == "ok"
    versions["torch-neuronx"] = "2.8.0.2.10"
    assert "built for torch 2.8" in envmod.check_torch_neuronx().checked
    versions["torch-neuronx"] = "0.0.1"
    assert "placeholder" in envmod.check_torch_neuronx().checked
    versions["nki"] = "0.2.1"
    assert envmod.check_nki_and_compiler().status == "warn"
    versions["torch"] = "2.5.0"
    assert envmod.check_torch().status == "fail"


def test_missing_neuron_packages_fail_on_trainium_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(envmod, "_version", lambda name: "2.9.0" if name == "torch" else None)
    off = envmod.environment_checks(2, 4, {}, dev=tmp_path, env={})
    by_name = {c.name: c for c in off}
    assert by_name["torch-neuronx"].status == "skip"
    assert all(c.status != "fail" for c in off)
    on = envmod.environment_checks(2, 4, {}, dev=_trainium(tmp_path, 1), env={})
    assert {c.name: c.status for c in on}["torch-neuronx"] == "fail"


def test_nki_rung_names_the_recipes_real_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25.14: a recipe with every kernel off is not reported as 'kernels: auto'."""
    monkeypatch.setattr(envmod, "_version", lambda name: None)
    off = envmod.check_nki_and_compiler({"relu2": "off", "attention": "off"})
    assert "all off, so nothing needs them" in off.checked and "auto" not in off.checked
    some = envmod.check_nki_and_compiler({"relu2": "auto", "rmsnorm": "on", "attention": "off"})
    assert "(relu2=auto, rmsnorm=on)" in some.checked


LADDER = [
    "recipe",
    "torch",
    "torch-neuronx",
    "nki / neuronx-cc",
    "cores",
    "NEURON_CC_FLAGS",
    "Neuron compile cache",
    "free disk",
    "dataset",
    "torch compile cache",
    "verify sandbox",
    "device holders",
    "torch device",
    "NKI entry points",
    "smoke kernel",
    "kernels",
]


def test_doctor_on_cpu_runs_every_rung_it_can_and_names_the_rest(
    capsys: pytest.CaptureFixture[str], sample_home: Path
) -> None:
    code, stdout, stderr = run_cli(["doctor", "--json", "--recipe", "cpu_smoke"], capsys)
    doc = json.loads(stdout)
    assert code == (1 if doc["status"] == "fail" else 0)
    assert doc["recipe"] == "cpu_smoke" and "kernels" not in doc
    rungs = {r["name"]: r for r in doc["rungs"]}
    assert [r["name"] for r in doc["rungs"]] == LADDER
    assert "kernels: all off" in rungs["recipe"]["checked"]  # issue 25.14
    assert rungs["dataset"]["status"] == "ok"
    assert str(sample_home) in rungs["dataset"]["checked"] and "$TRNF_HOME" in rungs["dataset"]["checked"]
    assert rungs["free disk"]["status"] in ("ok", "warn") and "GiB free" in rungs["free disk"]["checked"]
    assert str(sample_home / "compile") in rungs["torch compile cache"]["checked"]
    assert rungs["verify sandbox"]["status"] in ("ok", "warn")
    assert rungs["smoke kernel"]["status"] == "ok" and "interpreter" in rungs["smoke kernel"]["checked"]
    for name in ("cores", "device holders", "NKI entry points", "kernels"):
        assert rungs[name]["status"] == "skip" and rungs[name]["skipped"], rungs[name]
    assert "checking torch" in stderr


def test_a_missing_dataset_fails_naming_the_data_root_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_prepare_module: None
) -> None:
    from trnfrontier.doctor import local_checks
    from trnfrontier.recipes import load_recipe

    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NEURON_COMPETITION_R1_CACHE_DIR", str(tmp_path / "kit"))
    monkeypatch.delenv("TRNF_DATASET", raising=False)
    check = local_checks.check_dataset(load_recipe("cpu_smoke"), dict(__import__("os").environ))
    assert check.status == "warn" and "trnf prepare" in check.checked
    assert str(tmp_path / "kit") in check.checked
    assert f"$NEURON_COMPETITION_R1_CACHE_DIR (it wins over $TRNF_HOME={tmp_path / 'home'})" in check.checked


def test_sandbox_rung_warns_without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    from trnfrontier.doctor import local_checks

    monkeypatch.setenv("TRNF_BWRAP", "/nonexistent/bwrap")
    check = local_checks.check_sandbox()
    assert check.status == "warn" and "cannot run archive code" in check.checked


def test_processes_holding_neuron_devices_are_named(tmp_path: Path) -> None:
    from trnfrontier.doctor import local_checks

    dev = _trainium(tmp_path, 1)
    proc = tmp_path / "proc"
    for pid, target, cmd in ((41, "/dev/neuron0", b"python\0train.py"), (42, "/dev/null", b"sh")):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "fd" / "3").symlink_to(target)
        (proc / str(pid) / "cmdline").write_bytes(cmd)
    check = local_checks.check_device_holders(dev, proc)
    assert check.status == "warn" and "pid 41: python train.py" in check.checked
    assert "pid 42" not in check.checked
    (proc / "41" / "fd" / "3").unlink()
    assert local_checks.check_device_holders(dev, proc).status == "ok"


def test_disk_floor(tmp_path: Path) -> None:
    from trnfrontier.doctor import local_checks

    env = {"TRNF_HOME": str(tmp_path / "home")}
    assert local_checks.check_disk(env, tmp_path / "runs", 0.0).status == "ok"
    low = local_checks.check_disk(env, tmp_path / "runs", 1e9)
    assert low.status == "warn" and "a checkpoint or compile may fail" in low.checked


def test_doctor_kernels_on_cpu_runs_the_interpreter_and_says_what_it_skipped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, stdout, stderr = run_cli(
        ["doctor", "--kernels", "--json", "--recipe", "cpu_smoke"], capsys
    )
    doc = json.loads(stdout)["kernels"]
    assert doc["mode"] == "interpreter" and doc["dtype"] == "float32"
    assert "compile time and speed against PyTorch" in doc["skipped"][0]
    ran = {(r["kernel"], r["lnc"]): r for r in doc["results"]}
    kernels = ("relu2", "rmsnorm", "rope_qknorm", "cross_entropy", "attention", "polar_express")
    assert set(ran) == {(k, lnc) for k in kernels for lnc in (1, 2)}
    bad = [r for r in doc["results"] if r["status"] != "ok"]
    assert not bad, bad
    assert all(r["max_abs_error"] <= r["tolerance"] for r in doc["results"])
    assert "LNC 1 and 2" in stderr


def test_a_wrong_kernel_is_reported_as_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: relu2 without the square. doctor must say fail, not ok."""
    import torch

    from kernels.testing import load_kernel_module
    from kernels.testing.torch_bridge import TorchAdapter
    from trnfrontier.doctor import kernel_cases, kernel_checks
    from trnfrontier.runtime.kernels import backend

    mutant = TorchAdapter(
        load_kernel_module(
            "relu2",
            [
                (
                    "        nisa.activation(dst=yt[0:rows, 0:cols], op=nl.square, data=r[0:rows, 0:cols])",
                    "        nisa.activation(dst=yt[0:rows, 0:cols], op=nl.copy, data=r[0:rows, 0:cols])",
                )
            ],
        )
    )
    shapes = kernel_cases.Shapes(130, 1, 130, 16, 2, 1, 8, 300, 15.0)
    case = kernel_cases.cases(shapes, torch.device("cpu"), torch.float32)[0]
    assert case.kernel == "relu2"
    with backend.kernel_backend(lambda name: mutant, {"cpu"}):
        result = kernel_checks.measure(case, torch.device("cpu"), "float32", repeats=0)
    assert result["status"] == "fail" and result["max_abs_error"] > result["tolerance"]


def test_on_neuron_each_lnc_runs_in_its_own_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Neuron is usable, one worker per LNC; their rows make the document."""
    from trnfrontier.doctor import kernel_checks
    from trnfrontier.recipes import load_recipe

    launched: list[int] = []

    def worker(shapes: object, lnc: int) -> list[dict]:
        launched.append(lnc)
        return [{"lnc": lnc, "kernel": "relu2", "status": "ok" if lnc == 1 else "fail"}]

    monkeypatch.setattr(kernel_checks, "neuron_unusable", lambda: None)
    monkeypatch.setattr(kernel_checks, "_worker", worker)
    doc = kernel_checks.kernel_report(load_recipe("baseline_d10"))
    assert launched == [1, 2] and doc["mode"] == "neuron" and doc["dtype"] == "bfloat16"
    assert doc["shapes"] == doc["recipe_shapes"] and doc["status"] == "fail"


def test_a_worker_that_cannot_reach_a_neuroncore_is_one_failing_row() -> None:
    from trnfrontier.doctor import kernel_cases, kernel_checks

    shapes = kernel_cases.Shapes(130, 1, 130, 16, 2, 1, 8, 300, 15.0)
    rows = kernel_checks._worker(shapes, 2)  # no Neuron here: the worker exits non-zero
    assert len(rows) == 1 and rows[0]["status"] == "fail" and rows[0]["lnc"] == 2
    assert "worker exited" in rows[0]["error"]


def test_a_torch_check_process_that_dies_is_one_failing_rung(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rungs that import torch run in a child: when importing torch-neuronx kills it,
    the doctor says so in one rung and names the rest as skipped."""
    from trnfrontier import doctor, processes
    from trnfrontier.recipes import load_recipe

    monkeypatch.setattr(
        processes,
        "run_tree",
        lambda *a, **k: processes.Finished(-11, "", "Fatal Python error: Segmentation fault"),
    )
    rungs = doctor._torch_rungs(load_recipe("cpu_smoke"))
    assert [(r.name, r.status) for r in rungs] == [
        ("torch device", "fail"),
        ("NKI entry points", "skip"),
        ("smoke kernel", "skip"),
    ]
    assert "exited -11: Fatal Python error: Segmentation fault" in rungs[0].checked


def test_speed_environment_for_run_summaries(tmp_path: Path) -> None:
    cache = tmp_path / "cc"
    (cache / "MODULE_1").mkdir(parents=True)
    env = {
        "NEURON_CC_FLAGS": "--optlevel=1 --model-type transformer",
        "NEURON_LOGICAL_NC_CONFIG": "2",
        envmod.COMPILE_CACHE_ENV: str(cache),
    }
    found = envmod.speed_environment(env)  # the record a run keeps (runtime/speed_env.py)
    assert found["optlevel_1"] is True and found["lnc"] == 2
    assert found["compile_cache"] == "warm" and found["compile_cache_path"] == str(cache)
    assert found["compile_cache_entries"] == 1
    assert set(found["versions"]) == {"torch", "torch-neuronx", "neuronx-cc", "nki"}
    assert envmod.speed_environment({})["optlevel_1"] is False


def test_the_torch_rungs_child_runs_at_the_recipes_lnc(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell at another LNC must not reach the smoke kernel's child (NKI 0.7 would refuse
    the launch, and the rung would show the mismatch as a kernel failure)."""
    from trnfrontier import doctor, processes
    from trnfrontier.recipes import load_recipe

    recipe = load_recipe("cpu_smoke")
    seen: dict[str, str] = {}

    def run_tree(cmd: list[str], **kwargs: object) -> processes.Finished:
        seen.update(kwargs["env"])  # type: ignore[arg-type]
        return processes.Finished(0, "[]\n", "")

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(3 - recipe.runtime.lnc))
    monkeypatch.setattr(processes, "run_tree", run_tree)
    assert doctor._torch_rungs(recipe) == []
    assert seen["NEURON_LOGICAL_NC_CONFIG"] == str(recipe.runtime.lnc)


class _WrongAnswer:
    """A wrap_nki whose kernels launch and answer their input unchanged."""

    def __call__(self, kernel: object) -> object:
        return self

    def __getitem__(self, grid: tuple[int, ...]) -> object:
        return lambda x: x


@pytest.mark.parametrize(
    ("fail", "label"),
    [("wrap", "API: wrapping"), ("launch", "kernel: running"), ("wrong", "kernel: "), (None, "")],
)
def test_the_smoke_kernel_tells_an_api_failure_from_a_kernel_failure(
    monkeypatch: pytest.MonkeyPatch, fail: str | None, label: str
) -> None:
    """Through the real launch path (wrap_nki, then the grid, then the call) with a fake
    wrap_nki over the interpreted relu2 on CPU tensors."""
    from kernels.testing.torch_bridge import interpreted_torch_module
    from tests.kernels.test_kernel_launch import FakeWrapNki
    from trnfrontier.doctor import runtime_checks
    from trnfrontier.runtime.kernels import registration

    fake = _WrongAnswer() if fail == "wrong" else FakeWrapNki(fail)
    monkeypatch.setattr(registration, "_torch_neuronx_attr", lambda name: fake if name == "wrap_nki" else None)
    check = runtime_checks.smoke_on_neuron(2, device="cpu", kernel_file=interpreted_torch_module)
    assert "relu2.relu2_fwd[(2,)]((128, 128) float32)" in check.checked and "\n" not in check.checked
    if fail is None:
        assert check.status == "ok" and "max error" in check.checked, check
        return
    assert check.status == "fail" and check.checked.startswith(label), check
    other = "kernel:" if label.startswith("API") else "API:"
    assert other not in check.checked
