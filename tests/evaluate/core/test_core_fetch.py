"""``--bundle``: the sample, folders, zips, URLs and pin files; pins; unsafe zips refused."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest
from core_helpers import write_bundle
from test_prepare_download import TINY_BACKOFF, FaultyServer

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.evaluate.core import fetch
from trnfrontier.evaluate.core.bundle import BundleError

LINE = '{"query": "Q", "choices": ["a", "b"], "gold": 0}\n'


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRNF_DOWNLOAD_BACKOFF", str(TINY_BACKOFF))
    monkeypatch.delenv("NEURON_COMPETITION_R1_CACHE_DIR", raising=False)
    monkeypatch.delenv(fetch.BUNDLE_ENV, raising=False)
    return tmp_path / "home"


def folder(tmp_path: Path) -> Path:
    tasks = [{"label": "t", "icl_task_type": "multiple_choice", "dataset_uri": "t.jsonl", "num_fewshot": [0]}]
    return write_bundle(tmp_path / "src" / "eval_bundle", tasks, {"t": 50}, {"t.jsonl": LINE * 2})


def zip_of(members: dict[str, bytes], links: tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            if name in links:
                info.external_attr = 0o120777 << 16  # a symbolic link
            archive.writestr(info, data)
    return buffer.getvalue()


def bundle_zip(tmp_path: Path, extra: dict[str, bytes] | None = None) -> Path:
    root = folder(tmp_path)
    members = {f"eval_bundle/{p.relative_to(root).as_posix()}": p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    path = tmp_path / "eval_bundle.zip"
    path.write_bytes(zip_of({**members, **(extra or {})}))
    return path


def test_the_sample_is_pinned_and_marked_as_a_sample(home: Path) -> None:
    resolved = fetch.resolve(fetch.SAMPLE)
    assert resolved.sample and resolved.pinned and resolved.sha256 == fetch.SAMPLE_BUNDLE_SHA256
    assert resolved.bundle.root.is_relative_to(home / "core" / "bundles")


def test_a_zip_unpacks_once_into_the_data_home_and_is_pinned_by_its_sha256(tmp_path: Path, home: Path) -> None:
    path = bundle_zip(tmp_path, {"__MACOSX/._x": b"junk"})
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    resolved = fetch.resolve(str(path), sha.upper())
    assert resolved.pinned and resolved.sha256 == sha and resolved.sha256_of == "zip"
    assert resolved.bundle.root == home / "core" / "bundles" / sha / "eval_bundle"
    assert not (home / "core" / "bundles" / sha / "__MACOSX").exists()
    with pytest.raises(TrnfError, match="but the pin is 0{64}"):
        fetch.resolve(str(path), "0" * 64)


def test_a_folder_or_its_parent_resolves_with_a_content_digest(tmp_path: Path) -> None:
    root = folder(tmp_path)
    by_root, by_parent = fetch.resolve(str(root)), fetch.resolve(str(root.parent))
    assert by_root.sha256 == by_parent.sha256 and by_root.sha256_of == "folder" and not by_root.pinned
    (root / "eval_data" / "t.jsonl").write_text(LINE * 3, encoding="utf-8")
    with pytest.raises(TrnfError, match="but the pin is"):
        fetch.resolve(str(root), by_root.sha256)


def test_a_pin_file_names_the_bundle_and_its_sha256(tmp_path: Path) -> None:
    path = bundle_zip(tmp_path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    pin = tmp_path / "core_bundle.yaml"
    pin.write_text(f"bundle: {path.name}\nsha256: {sha}\n", encoding="utf-8")
    resolved = fetch.resolve(str(pin))
    assert resolved.pinned and resolved.sha256 == sha and resolved.source == str(pin)
    with pytest.raises(UsageError, match="disagrees with the pin"):
        fetch.resolve(str(pin), "1" * 64)
    pin.write_text("bundle: x.zip\n", encoding="utf-8")
    with pytest.raises(UsageError, match="a pin file holds"):
        fetch.resolve(str(pin))


def test_no_bundle_named_says_how_to_name_one(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="--core needs a bundle.*--bundle sample"):
        fetch.resolve(None)
    with pytest.raises(UsageError, match="not a SHA256"):
        fetch.resolve(fetch.SAMPLE, "abc")
    with pytest.raises(UsageError, match="no such file or folder"):
        fetch.resolve("/no/such/bundle")


@pytest.mark.parametrize(
    ("members", "links", "message"),
    [
        ({"eval_bundle/../../evil": b"x"}, (), "outside the bundle folder"),
        ({"/eval_bundle/core.yaml": b"x"}, (), "outside the bundle folder"),
        ({"eval_bundle/core.yaml": b"/etc/passwd"}, ("eval_bundle/core.yaml",), "a link or special file"),
        ({"other/core.yaml": b"icl_tasks: []"}, (), "no eval_bundle/core.yaml inside"),
    ],
)
def test_an_unsafe_or_wrong_zip_is_refused_and_leaves_nothing(tmp_path: Path, home: Path, members: dict, links: tuple, message: str) -> None:
    path = tmp_path / "bad.zip"
    path.write_bytes(zip_of(members, links))
    with pytest.raises(BundleError, match=message):
        fetch.resolve(str(path))
    assert not list((home / "core" / "bundles").iterdir())


def test_a_zip_that_unpacks_past_the_cap_is_refused(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "MAX_UNPACKED_BYTES", 1000)
    path = bundle_zip(tmp_path, {"eval_bundle/big.bin": b"\0" * 5000})
    with pytest.raises(BundleError, match="unpacks to more than"):
        fetch.resolve(str(path))
    assert not list((home / "core" / "bundles").iterdir())


def test_a_file_that_is_not_a_zip_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bundle.zip"
    path.write_text("not a zip", encoding="utf-8")
    with pytest.raises(BundleError, match="is not a zip file"):
        fetch.resolve(str(path))


def test_a_url_downloads_resumably_into_the_data_home(tmp_path: Path, home: Path) -> None:
    data = bundle_zip(tmp_path).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    with FaultyServer({"eval_bundle.zip": data}) as server:
        server.faults["eval_bundle.zip"] = ["drop", "500"]
        resolved = fetch.resolve(f"{server.url}/eval_bundle.zip", sha)
        assert resolved.pinned and resolved.sha256 == sha
        assert any(r[1] for r in server.requests)  # the retry resumed with a Range request
        downloads = list((home / "core" / "downloads").iterdir())
        assert [p.name.endswith("-eval_bundle.zip") for p in downloads] == [True]
        with pytest.raises(TrnfError, match="but the pin is"):
            fetch.resolve(f"{server.url}/eval_bundle.zip", "2" * 64)
        assert not list((home / "core" / "downloads").iterdir())  # not what was pinned: not kept
        with pytest.raises(TrnfError, match="HTTP 404.*--bundle URL"):
            fetch.resolve(f"{server.url}/missing.zip")


def test_concurrent_resolves_of_a_url_download_once_and_share_one_folder(tmp_path: Path, home: Path) -> None:
    import multiprocessing

    from core_helpers import resolve_worker, wait_for_lock_waiters

    data = bundle_zip(tmp_path).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    spawn = multiprocessing.get_context("spawn")
    with FaultyServer({"eval_bundle.zip": data}) as server:
        url = f"{server.url}/eval_bundle.zip"
        outs = [tmp_path / f"root-{n}" for n in range(2)]
        processes = [spawn.Process(target=resolve_worker, args=(str(home), url, sha, str(out))) for out in outs]
        with fetch.locked():  # both trials arrive while the lock is held: they must queue on it
            for process in processes:
                process.start()
            wait_for_lock_waiters(home / "core" / fetch.LOCK_FILE, [p.pid for p in processes if p.pid], processes)
        for process in processes:
            process.join(300)
        assert [p.exitcode for p in processes] == [0, 0]
        assert server.requests == [("eval_bundle.zip", None)]  # one download; the other found the zip
    roots = {out.read_text(encoding="utf-8") for out in outs}
    assert roots == {str(home / "core" / "bundles" / sha / fetch.ZIP_ROOT)}


def test_unpacking_again_keeps_a_complete_folder_another_process_reads(tmp_path: Path, home: Path) -> None:
    archive = bundle_zip(tmp_path)
    resolved = fetch.resolve(str(archive))
    folder = resolved.bundle.root.parent
    reader = open(resolved.bundle.root / "core.yaml", encoding="utf-8")  # another process, mid-read
    marker = folder / "in-use"
    marker.write_text("a reader's", encoding="utf-8")
    try:
        fetch.unpack(archive, folder)  # a second process that unpacked too, arriving late
        assert marker.read_text(encoding="utf-8") == "a reader's" and reader.read().startswith("icl_tasks")
        assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # its temporary copy is gone
    finally:
        reader.close()
