"""The crafted bad archives: each is built by one function and must fail one named check.

``CORPUS`` maps a case id to (builder, the check it targets). A builder gets a work
directory and returns the archive path (and, for the pickle case, writes nothing else).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

from verify_kit import LAUNCH, TRAIN_PY, build_archive, good_meta, raw_tar, tiny_state

from trnfrontier import submission as fmt

MARKER_NAME = "PWNED_MARKER"


def _info(name: str, type_: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = type_
    info.linkname = linkname
    info.mode = 0o644
    return info


def _with_good_members(work: Path, extra: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    """A good archive's members followed by the hostile ones, rewritten raw."""
    good = build_archive(work, "base.tar")
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    with tarfile.open(good) as tar:
        for member in tar.getmembers():
            entries.append((member, tar.extractfile(member).read()))  # type: ignore[union-attr]
    return raw_tar(work / "bad.tar", entries + extra)


# -- extraction -----------------------------------------------------------------------

def truncated(work: Path) -> Path:
    good = build_archive(work, "base.tar")
    data = good.read_bytes()
    out = work / "truncated.tar"
    out.write_bytes(data[: len(data) // 2 + 100])
    return out


def not_a_tar(work: Path) -> Path:
    out = work / "notatar.tar"
    out.write_bytes(b"this is just some text, not an archive\n" * 40)
    return out


def truncated_gzip(work: Path) -> Path:
    good = build_archive(work, "base.tar")
    data = gzip.compress(good.read_bytes(), compresslevel=1)
    out = work / "truncated.tar.gz"
    out.write_bytes(data[: len(data) // 3])
    return out


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def gzip_bomb(work: Path) -> Path:
    """96 MiB of zeros in a ~100 KB .tar.gz: refused from the headers (ratio), never inflated to disk."""
    out = work / "bomb.tar.gz"
    size = 96 << 20
    with tarfile.open(out, "w:gz", compresslevel=1) as tar:
        info = _info("train.py")
        info.size = size
        tar.addfile(info, io.BufferedReader(_Zeros(size)))
    return out


def dotdot(work: Path) -> Path:
    return _with_good_members(work, [(_info("../../x"), b"escaped\n")])


def absolute(work: Path) -> Path:
    return _with_good_members(work, [(_info(str(work / "abs_escape")), b"escaped\n")])


def symlink_out(work: Path) -> Path:
    return _with_good_members(work, [(_info("runtime/link.py", tarfile.SYMTYPE, "/etc/passwd"), None)])


def hardlink_out(work: Path) -> Path:
    return _with_good_members(work, [(_info("runtime/hard.py", tarfile.LNKTYPE, "../../etc/passwd"), None)])


def device_file(work: Path) -> Path:
    info = _info("runtime/dev.py", tarfile.CHRTYPE)
    info.devmajor, info.devminor = 1, 3
    return _with_good_members(work, [(info, None)])


def duplicate_member(work: Path) -> Path:
    return _with_good_members(work, [(_info("train.py"), b"def load_for_eval(p, d):\n    return None\n")])


# -- manifest -------------------------------------------------------------------------

def manifest_size_lie(work: Path) -> Path:
    return build_archive(work, edit_manifest=lambda m: m["files"][fmt.WRITEUP].update(size=3))


def manifest_sha_lie(work: Path) -> Path:
    return build_archive(work, edit_manifest=lambda m: m["files"][fmt.TRAIN_PY].update(sha256="0" * 64))


def manifest_missing_entry(work: Path) -> Path:
    return build_archive(work, edit_manifest=lambda m: m["files"].pop(fmt.METRICS_LOG))


def manifest_lists_absent(work: Path) -> Path:
    return build_archive(work, edit_manifest=lambda m: m["files"].update({"kernels/ghost.py": {"size": 1, "sha256": "a" * 64}}))


def unlisted_extra_file(work: Path) -> Path:
    return build_archive(work, unlisted={"kernels/extra.py": b"X = 1\n"})


# -- pins -----------------------------------------------------------------------------

def wrong_prepare(work: Path) -> Path:
    return build_archive(work, edit_manifest=lambda m: m.update(prepare_sha256="b" * 64))


# -- launch ---------------------------------------------------------------------------

def _launch(line: str) -> Callable[[Path], Path]:
    def build(work: Path) -> Path:
        return build_archive(work, launch=line)

    return build


# -- screen ---------------------------------------------------------------------------

def _train(snippet: str, replace: tuple[str, str] | None = None) -> Callable[[Path], Path]:
    def build(work: Path) -> Path:
        source = TRAIN_PY.replace(*replace) if replace else TRAIN_PY
        return build_archive(work, train_py=source + "\n" + snippet + "\n")

    return build


def oversize_file(work: Path) -> Path:
    big = b"# padding\n" * 30_000  # 300,000 bytes
    return build_archive(work, extra={"runtime/big.py": big})


def kernel_with_socket(work: Path) -> Path:
    return build_archive(work, extra={"kernels/relu2.py": b"import socket\n"})


# -- checkpoint -----------------------------------------------------------------------

class _Payload:
    """Unpickling this calls exec(), which would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def pickle_payload(work: Path) -> Path:
    state = tiny_state()
    evil = {"model_state": state, "model_config": {"hack": _Payload(work / MARKER_NAME)}, "meta": {}}
    return build_archive(work, final_pt=evil)


def nan_weights(work: Path) -> Path:
    state = tiny_state()
    state["proj.weight"][0, 0] = float("nan")
    return build_archive(work, state=state)


def inf_in_final_pt(work: Path) -> Path:
    state = tiny_state()
    bad = {k: v.clone() for k, v in state.items()}
    bad["head.weight"][1, 1] = float("inf")
    return build_archive(work, state=state, final_pt={"model_state": bad, "model_config": {}, "meta": {}})


def param_mismatch(work: Path) -> Path:
    return build_archive(work, edit_manifest=lambda m: m.update(params=59_600_000))


def _rebuild(work: Path, mutate: Callable[[Path], None]) -> Path:
    """A good archive whose source files are changed by ``mutate`` before an honest manifest is written."""
    out = build_archive(work)
    src = work / "submission.tar.src"
    mutate(src)
    files = {n: fmt.member_path(src, n) for n in fmt.REQUIRED_MEMBERS if n != fmt.MANIFEST}
    manifest = fmt.build_manifest(files, **good_meta())
    fmt.write_deterministic_tar({**files, fmt.MANIFEST: fmt.manifest_bytes(manifest)}, out)
    return out


def corrupt_safetensors(work: Path) -> Path:
    return _rebuild(work, lambda src: fmt.member_path(src, fmt.CHECKPOINT_SAFETENSORS).write_bytes(b"\xff" * 64))


# -- budget ---------------------------------------------------------------------------

def over_budget(work: Path) -> Path:
    return build_archive(work, times=[20.0, 30.0, 40.0, 50.0, 60.0, 1000.0, 1900.0])


def budget_no_header(work: Path) -> Path:
    return _rebuild(work, lambda src: fmt.member_path(src, fmt.STEP_LOG).write_text(json.dumps({"step": 1, "time": 5.0}) + "\n"))


# -- contract -------------------------------------------------------------------------

def _mode(mode: str) -> Callable[[Path], Path]:
    def build(work: Path) -> Path:
        return build_archive(work, train_py=TRAIN_PY.replace('MODE = "good"', f'MODE = "{mode}"'))

    return build


CORPUS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "truncated-tar": (truncated, "extract"),
    "truncated-gzip": (truncated_gzip, "extract"),
    "not-a-tar": (not_a_tar, "extract"),
    "gzip-bomb": (gzip_bomb, "extract"),
    "dotdot": (dotdot, "extract"),
    "absolute-path": (absolute, "extract"),
    "symlink-out": (symlink_out, "extract"),
    "hardlink-out": (hardlink_out, "extract"),
    "device-file": (device_file, "extract"),
    "duplicate-member": (duplicate_member, "extract"),
    "manifest-size-lie": (manifest_size_lie, "manifest"),
    "manifest-sha-lie": (manifest_sha_lie, "manifest"),
    "manifest-missing-entry": (manifest_missing_entry, "manifest"),
    "manifest-lists-absent": (manifest_lists_absent, "manifest"),
    "unlisted-extra-file": (unlisted_extra_file, "manifest"),
    "wrong-prepare-pin": (wrong_prepare, "pin:prepare"),
    "launch-rm-rf": (_launch(LAUNCH + "; rm -rf /"), "launch"),
    "launch-pipe": (_launch(LAUNCH + " | tee log"), "launch"),
    "launch-redirect": (_launch(LAUNCH + " > out.log"), "launch"),
    "launch-background": (_launch(LAUNCH + " &"), "launch"),
    "launch-substitution": (_launch("NEURON_LOGICAL_NC_CONFIG=$(id -u) torchrun --standalone --nproc_per_node=4 train.py"), "launch"),
    "launch-bad-nproc": (_launch("NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=2 train.py"), "launch"),
    "launch-extra-env": (_launch("FOO=1 NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 train.py"), "launch"),
    "launch-bad-lnc": (_launch("NEURON_LOGICAL_NC_CONFIG=3 torchrun --standalone --nproc_per_node=4 train.py"), "launch"),
    "reads-val-shard": (_train('VAL_PATH = "shards/shard_06542.parquet"'), "screen"),
    "val-dataloader": (_train('import prepare\nloader = prepare.make_dataloader(None, 8, 64, "val")'), "screen"),
    "val-shard-constant": (_train("from prepare import VAL_SHARD"), "screen"),
    "document-batches-val": (_train('import prepare\nit = prepare._document_batches(None, "public_val")'), "screen"),
    "opens-socket": (_train("import socket\ns = socket.socket()"), "screen"),
    "uses-subprocess": (_train('import subprocess\nsubprocess.run(["ls"])'), "screen"),
    "os-system": (_train('os.system("curl example.com")'), "screen"),
    "dynamic-import": (_train('mod = __import__("sock" + "et")'), "screen"),
    "not-allowed-import": (_train("import pandas"), "screen"),
    "imports-trnfrontier": (_train("from trnfrontier.runtime import model"), "screen"),
    "no-load-for-eval": (_train("", ("def load_for_eval(", "def load_model(")), "screen"),
    "monkeypatch-prepare": (_train("import prepare\nprepare.evaluate_bpb = lambda *a, **k: {'val_bpb': 0.1}"), "screen"),
    "setattr-prepare": (_train("import prepare as p\nsetattr(p, 'TRAIN_TIME_BUDGET_SECONDS', 10**9)"), "screen"),
    "kernel-opens-socket": (kernel_with_socket, "screen"),
    "file-over-portal-limit": (oversize_file, "upload-size"),
    "pickle-payload": (pickle_payload, "checkpoint"),
    "nan-weights": (nan_weights, "checkpoint"),
    "inf-in-final-pt": (inf_in_final_pt, "checkpoint"),
    "param-count-mismatch": (param_mismatch, "checkpoint"),
    "corrupt-safetensors": (corrupt_safetensors, "checkpoint"),
    "over-budget-log": (over_budget, "budget"),
    "budget-log-no-header": (budget_no_header, "budget"),
    "peeks-at-future": (_mode("peek"), "contract"),
    "batch-dependent": (_mode("batch"), "contract"),
    "non-deterministic": (_mode("noise"), "contract"),
    "forward-hook": (_mode("hook"), "contract"),
}
