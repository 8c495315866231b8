"""The sandbox itself (bubblewrap): what a confined Python process can and cannot do, and verify without it."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from verify_kit import build_archive, pins_file

from tests.cli_run import run_cli
from trnfrontier.untrusted import sandbox
from trnfrontier.verify import Options, verify_archive

needs_bwrap = pytest.mark.skipif(not sandbox.available().ok, reason=f"no usable bubblewrap here: {sandbox.available().detail}")


def _run(code: str, scratch: Path, *, env: dict[str, str] | None = None, timeout: float = 60, limits: sandbox.Limits | None = None) -> tuple[int | None, str]:
    scratch.mkdir(exist_ok=True)
    jail = sandbox.Jail(scratch=scratch, env=env or {})
    # -S: no site-packages needed for these probes, so each costs a bare interpreter start.
    done = sandbox.run_confined([sys.executable, "-I", "-S", "-c", code], jail, timeout=timeout, sandboxed=True, limits=limits)
    return done.code, done.output


@needs_bwrap
def test_no_network_not_even_the_hosts_loopback(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code, out = _run(f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e)", tmp_path / "s")
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()
    assert code == 0 and "blocked" in out and "CONNECTED" not in out


@needs_bwrap
def test_filesystem_is_read_only_but_the_scratch_dir(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    probe = (
        "import os\n"
        f"for p in [{str(outside)!r}, '/etc/trnf-x', '/usr/trnf-x', '/trnf-x', os.environ['HOME'] + '/ok', '/tmp/ok']:\n"
        "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n    except OSError as e:\n        print('refused', p)\n"
        f"print('sees_outside_dir', os.path.exists({str(tmp_path)!r} + '/other'))\n"
    )
    (tmp_path / "other").mkdir()
    code, out = _run(probe, tmp_path / "s")
    assert code == 0, out
    assert "refused /etc/trnf-x" in out and "refused /usr/trnf-x" in out and "refused /trnf-x" in out
    assert "wrote " + str(tmp_path / "s" / "ok") in out and (tmp_path / "s" / "ok").exists()
    # /tmp is the sandbox's own tmpfs: writable, gone with the run (the host's file never appears).
    assert "wrote /tmp/ok" in out and not outside.exists()
    assert "sees_outside_dir False" in out  # only what the jail binds is there at all


@needs_bwrap
def test_no_cgroup_hierarchy_is_visible_inside(tmp_path: Path) -> None:
    """Two sandboxes share nothing: not the host's cgroups (the tree limits are applied from outside)."""
    code, out = _run("import os\nprint('cgroup', os.path.exists('/sys/fs/cgroup'), 'cpu', os.path.isdir('/sys/devices/system/cpu'))",
                     tmp_path / "s")
    assert code == 0 and "cgroup False cpu True" in out, out


@needs_bwrap
def test_environment_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    code, out = _run("import os, json\nprint(json.dumps(dict(os.environ)))", tmp_path / "s", env={"WANTED": "1"})
    env = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and env["WANTED"] == "1" and "AWS_SECRET_ACCESS_KEY" not in env
    assert set(env) <= {"WANTED", "HOME", "TMPDIR", "PATH", "PWD", "LC_CTYPE"}


@needs_bwrap
def test_no_process_survives_the_run(tmp_path: Path) -> None:
    tag = f"trnf-sandbox-daemon-{os.getpid()}"
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/bin/sh', ['/bin/sh', '-c', 'exec sleep 300 # {tag}'])\n    os._exit(0)\n"
        "print('parent exits')\n"
    )
    code, _ = _run(daemon, tmp_path / "s")
    assert code == 0
    time.sleep(1.0)
    alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and tag.encode() in _cmdline(p)]
    assert alive == []


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


@needs_bwrap
def test_wall_and_memory_limits(tmp_path: Path) -> None:
    started = time.monotonic()
    code, _ = _run("import time\ntime.sleep(300)", tmp_path / "a", timeout=2)
    assert code is None and time.monotonic() - started < 30
    code, out = _run("x = bytearray(2 << 30)\nprint('allocated')", tmp_path / "b", limits=sandbox.Limits(wall_seconds=30, memory_bytes=512 << 20))
    assert code != 0 and "MemoryError" in out and "allocated" not in out


def test_without_bubblewrap_archive_code_is_refused_unless_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sandbox.BWRAP_ENV, str(tmp_path / "no-bwrap-here"))
    archive = build_archive(tmp_path)
    report = verify_archive(archive, Options(pins_file=pins_file(tmp_path)))
    assert report.sandbox.startswith("NO SANDBOX") and "bwrap" in report.sandbox
    check = report.get("contract")
    assert check.verdict == "fail" and "--allow-unsandboxed" in check.reason and not report.ok
    allowed = verify_archive(archive, Options(pins_file=pins_file(tmp_path), allow_unsandboxed=True))
    assert allowed.sandbox.startswith("NOT SANDBOXED") and allowed.get("contract").verdict == "pass", allowed.get("contract").reason
    assert allowed.to_json()["sandbox"] == allowed.sandbox


def test_the_report_says_first_how_archive_code_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv(sandbox.BWRAP_ENV, str(tmp_path / "no-bwrap-here"))
    args = ["verify", str(build_archive(tmp_path)), "--pins", str(pins_file(tmp_path))]
    code, out, _ = run_cli(args, capsys)
    assert code == 1 and out.strip().splitlines()[0].startswith("NO SANDBOX")
    code, out, _ = run_cli([*args, "--json"], capsys)
    assert code == 1 and json.loads(out)["sandbox"].startswith("NO SANDBOX")


@needs_bwrap
def test_only_site_packages_of_sys_path_are_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m` puts the working directory (a home folder, say) on sys.path: the sandbox must not bind it."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret key")
    monkeypatch.setattr(sys, "path", [str(home), *sys.path])
    sandbox.python_paths.cache_clear()
    try:
        code, out = _run(f"import os\nprint('visible', os.path.exists({str(home / '.ssh')!r}))", tmp_path / "s")
    finally:
        sandbox.python_paths.cache_clear()
    assert code == 0 and "visible False" in out
