"""Every hostile archive (corpus.py and hostile.py) is rejected by its named check, and whatever of
its code ran stayed contained: no file outside verify's temp dir, nothing received by a
listener on 127.0.0.1, no process left behind, no secret of the caller in the report.
Score fakes are also verified with --rerun-eval, which must refuse them."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from corpus import CORPUS
from hostile import HOSTILE, SECRET_VAR, Case, Ctx
from verify_kit import RERUN, pins_file

import trnfrontier.verify.runner as runner
from trnfrontier.untrusted import sandbox
from trnfrontier.verify import Options, verify_archive
from trnfrontier.verify.report import skipped

ORIGINAL = "original content\n"


def _all_cases() -> dict[str, Case]:
    old = {name: Case(lambda ctx, build=build: build(ctx.work), check, runs=check == "contract") for name, (build, check) in CORPUS.items()}
    return {**old, **HOSTILE}


CASES = _all_cases()


def test_the_corpus_covers_every_family_with_over_100_archives() -> None:
    assert len(CASES) >= 100
    assert sum(c.runs for c in CASES.values()) >= 20 and sum(c.fake for c in CASES.values()) >= 4


@pytest.fixture()
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP listener on 127.0.0.1 (port 0: any free one); every connection and byte it gets is recorded."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.settimeout(1.0)
            try:
                received.append(b"<connection>" + conn.recv(1 << 16))
            except OSError:
                received.append(b"<connection>")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    stop.set()
    thread.join(timeout=5)
    server.close()


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _leftovers(marker: str, wait: float = 5.0) -> list[str]:
    """Processes whose command line names ``marker`` (verify's temp dir lives under it), after a grace period."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in cmdline and state != "Z":
                found.append(f"{entry.name}: {cmdline[:160]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_archive_is_rejected_and_contained(case: str, tmp_path: Path, listener, monkeypatch: pytest.MonkeyPatch,
                                                   request: pytest.FixtureRequest) -> None:
    spec = CASES[case]
    for name in ("tmp", "work", "outside"):
        (tmp_path / name).mkdir()
    keep = tmp_path / "outside" / "keep.txt"
    keep.write_text(ORIGINAL)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    secret = f"sk-{os.getpid()}-{case}-do-not-leak"
    monkeypatch.setenv(SECRET_VAR, secret)
    for key, value in (spec.env or {}).items():
        monkeypatch.setenv(key, value)
    if spec.fake:
        request.getfixturevalue("sample_home")  # the dataset the trusted rerun reads
    if not spec.runs:
        # Its train.py is the honest one and the hostile part is static: serving the model would
        # only cost a sandbox start (the executing families are the `runs` cases).
        monkeypatch.setattr(runner, "_contract_check", lambda *a, **k: skipped("contract", "not served in this test"))
    port, received = listener
    archive = spec.build(Ctx(work=tmp_path / "work", port=port, marker=keep, secret=secret))
    pins = pins_file(tmp_path / "work")
    before = _tree(tmp_path)

    report = verify_archive(archive, Options(pins_file=pins, timeout=120, rerun_eval=spec.fake, dry_run=spec.dry, dry_run_steps=2,
                                             **{**RERUN, **(spec.settings or {})}))

    check = report.get(spec.check)
    assert check is not None, f"{case}: no {spec.check} check in {[c.name for c in report.checks]}"
    assert check.verdict == "fail", f"{case}: {spec.check} was {check.verdict}: {check.reason}"
    assert any(part in check.reason for part in spec.says.split("|")), f"{case}: {spec.check} does not say {spec.says!r}: {check.reason}"
    assert not report.ok and report.exit_code == 1
    if spec.runs and not sandbox.available().ok:
        assert "no sandbox" in check.reason
    if spec.fake:
        rerun = report.get("rerun-eval")
        assert rerun is not None and rerun.verdict == "fail", f"{case}: rerun-eval {rerun}"
    # Contained: nothing written outside the temp dir (which is gone), nothing sent, nothing left, nothing leaked.
    assert _tree(tmp_path) == before, f"{case}: verify left {_tree(tmp_path) ^ before}"
    assert keep.read_text() == ORIGINAL
    assert received == [], f"{case}: the listener received {received!r}"
    assert _leftovers(str(tmp_path)) == [], f"{case}: processes left behind"
    assert secret not in json.dumps(report.to_json())
