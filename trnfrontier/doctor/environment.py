"""`trnf doctor`'s environment rungs: versions, cores, NEURON_CC_FLAGS, the Neuron
compile cache. No torch: versions come from package metadata and devices from
``/dev/neuron*`` and ``NEURON_RT_VISIBLE_CORES``, so these rungs are fast and work on a
machine where importing torch-neuronx would fail.

Each check returns a :class:`Check`: ok / warn / fail / skip, what it checked (one line)
and what it did not check and why (one line, or empty).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# One reading of versions and of the compile cache's place, shared with what every run
# records (runtime/speed_env.py): doctor and summary.json never disagree.
from trnfrontier.runtime import speed_env
from trnfrontier.runtime.speed_env import COMPILE_CACHE_ENV, compile_cache_url
from trnfrontier.runtime.speed_env import package_version as _version

Status = str  # "ok" | "warn" | "fail" | "skip"

TORCH_MIN = (2, 9)  # pyproject's torch>=2.9: the Trainium DLAMI venvs' torch
NKI_MIN = (0, 3)  # the `nki` namespace kernels (NKI 0.3+, "Beta 2")
TRN2_CORES_PER_CHIP = 8  # physical NeuronCore-v3 per Trainium2 chip
MIN_FREE_GIB = 20.0  # a d10-d20 model's NEFFs plus a checkpoint or two


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    checked: str
    skipped: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def check_torch() -> Check:
    version = _version("torch")
    if version is None:
        return Check(
            "torch", "fail", "not installed; use the DLAMI's Neuron venv (it has torch 2.9+)"
        )
    if _numbers(version)[:2] < TORCH_MIN:
        return Check("torch", "fail", f"{version} < 2.9; the Neuron venvs ship 2.9+")
    return Check("torch", "ok", version)


def check_torch_neuronx() -> Check:
    version = _version("torch-neuronx")
    torch_version = _version("torch") or "?"
    if version is None:
        return Check(
            "torch-neuronx",
            "fail",
            "not installed: no `neuron` device; it comes from AWS's Neuron pip repository "
            "(https://pip.repos.neuron.amazonaws.com) or the DLAMI's Neuron venv",
        )
    if _numbers(version) < (1,):
        return Check(
            "torch-neuronx", "fail", f"{version}: the empty PyPI placeholder, not AWS's package"
        )
    # torch-neuronx releases are numbered after the torch they are built for (2.9.0.x)
    if _numbers(version)[:2] != _numbers(torch_version)[:2]:
        return Check(
            "torch-neuronx",
            "fail",
            f"{version} is built for torch {'.'.join(map(str, _numbers(version)[:2]))}, "
            f"this venv has torch {torch_version}; reinstall both from the Neuron repository",
        )
    return Check("torch-neuronx", "ok", f"{version} (torch {torch_version})")


def kernels_summary(kernels: dict[str, str]) -> str:
    """The recipe's kernels section in one phrase: "all off" or "relu2=auto, rmsnorm=on"."""
    chosen = [f"{name}={mode}" for name, mode in sorted(kernels.items()) if mode != "off"]
    return ", ".join(chosen) if chosen else "all off"


def check_nki_and_compiler(kernels: dict[str, str] | None = None) -> Check:
    """nki / neuronx-cc against what the recipe's kernels need (``kernels``: kernel -> mode)."""
    nki, cc = _version("nki"), _version("neuronx-cc")
    wanted = kernels_summary(kernels or {})
    need = (
        "the recipe's kernels are all off, so nothing needs them"
        if wanted == "all off"
        else f"the recipe's kernels ({wanted}): auto falls back to PyTorch, on stops"
    )
    if nki is None and cc is None:
        return Check("nki / neuronx-cc", "fail", f"neither installed; {need}")
    if nki is None:
        return Check(
            "nki / neuronx-cc",
            "warn",
            f"neuronx-cc {cc}, but no `nki` package: the kernels need NKI 0.3+; {need}",
        )
    if _numbers(nki)[:2] < NKI_MIN:
        return Check(
            "nki / neuronx-cc",
            "warn",
            f"nki {nki} < 0.3: the kernels use the nki.* namespace of NKI 0.3+; {need}",
        )
    return Check(
        "nki / neuronx-cc",
        "ok",
        f"nki {nki}, neuronx-cc {cc or 'not installed'}; recipe kernels: {wanted}",
    )


def parse_core_list(text: str) -> list[int]:
    """``NEURON_RT_VISIBLE_CORES`` ("0-3", "4,5", "0-1,6") -> [0, 1, 2, 3] ..."""
    cores: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cores.extend(range(int(lo), int(hi or lo) + 1))
    return cores


def visible_cores(dev: Path, env: dict[str, str]) -> tuple[int, int, str]:
    """(chips, physical cores visible to this process, how that was decided)."""
    chips = len([p for p in dev.glob("neuron*") if re.fullmatch(r"neuron\d+", p.name)])
    physical = chips * TRN2_CORES_PER_CHIP
    listed = env.get("NEURON_RT_VISIBLE_CORES")
    if listed:
        try:
            return chips, len(parse_core_list(listed)), f"NEURON_RT_VISIBLE_CORES={listed}"
        except ValueError:
            return (
                chips,
                physical,
                f"NEURON_RT_VISIBLE_CORES={listed!r} unreadable; counted {dev}/neuron*",
            )
    return chips, physical, f"{chips} device(s) {dev}/neuron* x {TRN2_CORES_PER_CHIP} cores"


def check_cores(lnc: int, nproc: int, dev: Path, env: dict[str, str]) -> Check:
    """Visible cores against the recipe's LNC and process count (one process per logical core)."""
    env_lnc = env.get("NEURON_LOGICAL_NC_CONFIG")
    if env_lnc is not None and env_lnc != str(lnc):
        return Check(
            "cores",
            "warn",
            f"NEURON_LOGICAL_NC_CONFIG={env_lnc} but the recipe says runtime.lnc={lnc}; trnf train sets the recipe's",
        )
    chips, physical, how = visible_cores(dev, env)
    if chips == 0:
        return Check(
            "cores",
            "skip",
            f"no {dev}/neuron* devices",
            "NeuronCores against LNC and nproc: not a Trainium machine (or no Neuron driver)",
        )
    logical = physical // lnc
    if nproc > logical:
        return Check(
            "cores",
            "fail",
            f"{how} = {physical} physical = {logical} logical at LNC={lnc}, fewer than runtime.nproc={nproc}; "
            f"lower nproc or use LNC=1",
        )
    spare = f"; {logical - nproc} logical core(s) idle" if nproc < logical else ""
    return Check("cores", "ok", f"{how} = {logical} logical at LNC={lnc} for nproc={nproc}{spare}")


def check_compile_cache(env: dict[str, str], min_free_gib: float = MIN_FREE_GIB) -> Check:
    """The Neuron compile cache: where it is and the free disk under it (a compile into a
    full disk left a team's cache poisoned)."""
    url = compile_cache_url(env)
    if "://" in url:
        return Check("Neuron compile cache", "ok", url, "free space (a remote cache)")
    path = Path(url)
    probe = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free / 2**30
    where = (
        f"{path} ({'exists' if path.exists() else 'created on first compile'}), {free:.1f} GiB free"
    )
    if free < min_free_gib:
        return Check(
            "Neuron compile cache",
            "warn",
            f"{where} < {min_free_gib:.0f} GiB: a compile into a full disk can leave a broken "
            f"cache entry behind; free space or set {COMPILE_CACHE_ENV}",
        )
    return Check("Neuron compile cache", "ok", where)


# flag -> (predicate on its value, why it is suspicious in a timed training run)
SUSPICIOUS_CC_FLAGS: dict[str, tuple[Callable[[str | None], bool], str]] = {
    "--target": (lambda v: v not in (None, "trn2"), "compiles for another chip than Trn2"),
    "--auto-cast-type": (
        lambda v: v is not None and v.startswith("fp8"),
        "FP8 auto-cast changes the numerics of every matmul",
    ),
    "--logical-nc-config": (
        lambda v: True,
        "set LNC with NEURON_LOGICAL_NC_CONFIG (runtime.lnc), not a compiler flag",
    ),
}
# A team's protocol records that NEURON_CC_FLAGS without --optlevel=1 silently halved
# their training throughput (issue 24); the flag is what they run with.
OPTLEVEL_HINT = (
    "no --optlevel=1: a team measured half the training throughput without it; "
    "set NEURON_CC_FLAGS='--optlevel=1 ...' unless `trnf profile` shows otherwise"
)


def _flags(words: list[str]) -> tuple[dict[str, str | None], list[str]]:
    seen: dict[str, str | None] = {}
    problems: list[str] = []
    for i, word in enumerate(words):
        if not word.startswith("-"):
            continue
        flag, _, value = word.partition("=")
        val: str | None = value or (
            words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("-") else None
        )
        if flag in seen:
            problems.append(f"{flag} given twice (the last one wins)")
        seen[flag] = val
        rule = SUSPICIOUS_CC_FLAGS.get(flag)
        if rule is not None and rule[0](val):
            problems.append(f"{word}: {rule[1]}")
    return seen, problems


def check_cc_flags(env: dict[str, str], on_trainium: bool = True) -> Check:
    """NEURON_CC_FLAGS: parses, no suspicious flag, and --optlevel=1 present (a warning
    only where it matters: on Trainium)."""
    raw = env.get("NEURON_CC_FLAGS", "")
    try:
        words = shlex.split(raw)
    except ValueError as exc:
        return Check("NEURON_CC_FLAGS", "fail", f"{raw!r} does not parse ({exc})")
    seen, problems = _flags(words)
    optlevel_1 = seen.get("--optlevel", "") == "1" or "-O1" in seen
    if not optlevel_1:
        problems.append(OPTLEVEL_HINT)
    shown = raw.strip() or "unset (compiler defaults)"
    if not on_trainium:
        return Check(
            "NEURON_CC_FLAGS",
            "ok",
            f"{shown}" + (f"; on Trainium: {'; '.join(problems)}" if problems else ""),
            "its effect on step time (not a Trainium machine)",
        )
    if problems:
        return Check("NEURON_CC_FLAGS", "warn", f"{shown}: " + "; ".join(problems))
    return Check("NEURON_CC_FLAGS", "ok", shown)


def environment_checks(
    lnc: int,
    nproc: int,
    kernels: dict[str, str],
    dev: Path = Path("/dev"),
    env: dict[str, str] | None = None,
) -> list[Check]:
    """The environment rungs in ladder order. Off Trainium (no /dev/neuron*), missing
    Neuron packages are skips, not failures: nothing here needs them."""
    env = dict(os.environ if env is None else env)
    cores = check_cores(lnc, nproc, dev, env)
    trainium = cores.status != "skip"
    neuron = [check_torch_neuronx(), check_nki_and_compiler(kernels)]
    if not trainium:
        neuron = [
            Check(c.name, "skip", c.checked, "needed only on a Trainium machine")
            if c.status in ("fail", "warn")
            else c
            for c in neuron
        ]
    cache = check_compile_cache(env)
    if not trainium:
        cache = Check(cache.name, "skip", cache.checked, "the Neuron cache is used on Trainium only")
    return [check_torch(), *neuron, cores, check_cc_flags(env, trainium), cache]


def speed_environment(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What in this environment changes training speed, as a run started from this shell
    on Trainium would record it in summary.json (``runtime/speed_env.capture``, the one
    reader: versions from package metadata, NEURON_CC_FLAGS, LNC, host, the compile
    cache's place, state and entries), plus whether NEURON_CC_FLAGS has --optlevel=1."""
    env = dict(os.environ if env is None else env)
    record = speed_env.capture(world_size=int(env.get("WORLD_SIZE") or 1), device="neuron", env=env)
    try:
        seen, _ = _flags(shlex.split(env.get("NEURON_CC_FLAGS", "")))
    except ValueError:
        seen = {}
    return {**record, "optlevel_1": seen.get("--optlevel", "") == "1" or "-O1" in seen}
