"""ClimbMix downloads against a misbehaving HTTP server on 127.0.0.1.

Every failure mode ends in a valid shard under its final name or in a clear error, and
never in a corrupt file under the final name.
"""

from __future__ import annotations

import importlib.util
import io
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

TINY_BACKOFF = 0.001
STUB_PREPARE = Path(__file__).resolve().parent / "fixtures" / "kit" / "prepare.py"


def parquet_bytes(texts: list[str]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buffer, compression="zstd")
    return buffer.getvalue()


class FaultyServer:
    """Serves ``files`` by name; ``faults[name]`` is a list of behaviours used one per
    request (then plain service): drop, 500, truncate, corrupt, 404."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.faults: dict[str, list[str]] = {}
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                name = self.path.rsplit("/", 1)[-1]
                server.requests.append((name, self.headers.get("Range")))
                queue = server.faults.get(name, [])
                fault = queue.pop(0) if queue else "ok"
                body = server.files.get(name)
                if body is None or fault == "404":
                    self.send_error(404)
                    return
                if fault == "500":
                    self.send_error(500)
                    return
                start = 0
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].split("=")[1].split("-")[0])
                if fault == "truncate":  # a short file announced as complete
                    body = body[: len(body) // 2]
                if fault == "corrupt":  # same size, damaged footer
                    body = body[:-12] + b"\0" * 8 + body[-4:]
                part = body[start:]
                if start:
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                if fault == "drop":  # announce everything, send half, hang up
                    self.wfile.write(part[: len(part) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(part)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/resolve/main"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FaultyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def shard() -> bytes:
    return parquet_bytes([f"Document {i} says something about shards and retries." for i in range(2000)])


@pytest.fixture()
def server(shard: bytes) -> Iterator[FaultyServer]:
    with FaultyServer({"shard_00000.parquet": shard}) as running:
        yield running


def fetch(prepare_module, server: FaultyServer, tmp_path: Path, retries: int = 4) -> Path:
    return prepare_module.download_file(f"{server.url}/shard_00000.parquet", tmp_path / "shard_00000.parquet",
                                        retries=retries, backoff=TINY_BACKOFF)


def test_dropped_connection_is_resumed_with_a_range_request(prepare_module, server, shard, tmp_path) -> None:
    server.faults["shard_00000.parquet"] = ["drop"]
    path = fetch(prepare_module, server, tmp_path)
    assert path.read_bytes() == shard
    assert server.requests[0] == ("shard_00000.parquet", None)
    assert server.requests[1] == ("shard_00000.parquet", f"bytes={len(shard) // 2}-")
    assert not (tmp_path / "shard_00000.parquet.partial").exists()


@pytest.mark.parametrize("faults", [["500", "500"], ["truncate"], ["corrupt"], ["drop", "500", "corrupt"]])
def test_transient_faults_end_in_a_valid_shard(prepare_module, server, shard, tmp_path, faults) -> None:
    server.faults["shard_00000.parquet"] = list(faults)
    path = fetch(prepare_module, server, tmp_path)
    assert path.read_bytes() == shard and prepare_module.parquet_is_valid(path)
    assert len(server.requests) == len(faults) + 1


@pytest.mark.parametrize("fault", ["corrupt", "truncate", "drop", "500"])
def test_persistent_faults_end_in_a_clear_error_and_no_shard(prepare_module, server, tmp_path, fault) -> None:
    server.faults["shard_00000.parquet"] = [fault] * 10
    with pytest.raises(prepare_module.PrepareError, match=r"could not download .*shard_00000.parquet after 3 attempts"):
        fetch(prepare_module, server, tmp_path, retries=2)
    assert not (tmp_path / "shard_00000.parquet").exists()
    partial = tmp_path / "shard_00000.parquet.partial"
    assert not partial.exists() or not prepare_module.parquet_is_valid(partial)


def test_missing_shard_fails_at_once(prepare_module, server, tmp_path) -> None:
    with pytest.raises(prepare_module.PrepareError, match="HTTP 404"):
        prepare_module.download_file(f"{server.url}/shard_00099.parquet", tmp_path / "x.parquet",
                                     retries=5, backoff=TINY_BACKOFF)
    assert len(server.requests) == 1


def test_unreachable_server_is_one_clear_error(prepare_module, tmp_path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(prepare_module.PrepareError, match="could not download.*use --source sample"):
        prepare_module.download_file(f"http://127.0.0.1:{port}/shard_00000.parquet", tmp_path / "s.parquet",
                                     retries=1, backoff=TINY_BACKOFF)
    assert not (tmp_path / "s.parquet").exists()


def climbmix_files(prepare_module, sample_home: Path, limit: int | None = None) -> dict[str, bytes]:
    """The sample documents served as ClimbMix shards 00000 (train) and 06542 (validation)."""
    shards = sample_home / "datasets" / "sample" / "shards"
    train = pq.read_table(shards / "train_00000.parquet").column("text").to_pylist()[:limit]
    val = pq.read_table(shards / "public_val_00000.parquet").column("text").to_pylist()[:limit]
    return {prepare_module.shard_name(0): parquet_bytes(train),
            prepare_module.shard_name(prepare_module.VAL_SHARD): parquet_bytes(val)}


def test_climbmix_setup_end_to_end_and_reuse(prepare_module, sample_home, tmp_path, monkeypatch) -> None:
    """Shards land where the kit keeps them (<root>/data/), the shipped tokenizer is unpacked
    into <root>/tokenizer/ (BOS 8188); the second setup makes no request."""
    files = climbmix_files(prepare_module, sample_home, limit=400)
    with FaultyServer(files) as running:
        running.faults[prepare_module.shard_name(0)] = ["drop", "500"]
        monkeypatch.setenv("TRNF_CLIMBMIX_URL", running.url)
        stages: set[str] = set()
        home = tmp_path / "home"
        result = prepare_module.setup("climbmix", num_train_shards=1, home=home, backoff=TINY_BACKOFF,
                                      progress=lambda stage, done, total, unit: stages.add(stage))
        assert result["source"] == "climbmix" and result["reused"] is False
        assert result["documents"] == 800
        assert stages == {"download", "tokenize"}  # the tokenizer is shipped, not trained
        assert sorted(p.name for p in (home / "data").iterdir()) == sorted(files)
        assert all((home / "data" / name).read_bytes() == body for name, body in files.items())
        assert sorted(p.name for p in (home / "tokenizer").iterdir()) == ["token_bytes.pt", "tokenizer.pkl"]
        assert result["tokenizer"] == "shipped" and result["tokenizer_path"] == str(home / "tokenizer" / "tokenizer.pkl")
        assert result["tokenizer_sha256"] == prepare_module.TOKENIZER_ARTIFACT_SHA256
        manifest = json.loads((home / "datasets" / "climbmix" / "manifest.json").read_text())
        assert sorted(e["path"] for e in manifest["shards"]) == sorted(f"../../data/{name}" for name in files)
        monkeypatch.setenv("TRNF_HOME", str(home))
        monkeypatch.setenv("TRNF_DATASET", "climbmix")
        tokenizer = prepare_module.ensure_tokenizer()
        assert tokenizer.get_bos_token_id() == 8188 and tokenizer.sha256 == prepare_module.TOKENIZER_ARTIFACT_SHA256
        served = len(running.requests)
        again = prepare_module.setup("climbmix", num_train_shards=1, home=home, backoff=TINY_BACKOFF)
        assert again["reused"] is True and len(running.requests) == served

        # Asking for a shard the server lacks fails clearly and keeps the prepared dataset.
        with pytest.raises(prepare_module.PrepareError, match="shard_00001.parquet: HTTP 404"):
            prepare_module.setup("climbmix", num_train_shards=2, home=home, backoff=TINY_BACKOFF)
        assert prepare_module.setup("climbmix", num_train_shards=1, home=home)["reused"] is True

    # A kit-layout prepare.py (the stub organisers' kit) reads this root as its cache dir:
    # the same training documents, our tokenizer with BOS 8188.
    monkeypatch.setenv("NEURON_COMPETITION_R1_CACHE_DIR", str(home))
    spec = importlib.util.spec_from_file_location("stub_kit_prepare_on_our_root", STUB_PREPARE)
    assert spec is not None and spec.loader is not None
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)
    texts, epoch = next(stub._document_batches("train", 0, 1, tokenizer_batch_size=5))
    assert epoch == 1 and texts == pq.read_table(io.BytesIO(files[prepare_module.shard_name(0)])).column("text").to_pylist()[:5]
    assert stub.ensure_tokenizer().get_bos_token_id() == 8188


def test_a_data_root_the_kit_filled_is_reused_without_downloading(prepare_module, sample_home, tmp_path, monkeypatch) -> None:
    """The organisers' setup left shards in <root>/data/ and its own tokenizer in
    <root>/tokenizer/; an older trnf left a shard in datasets/climbmix/shards/. Nothing is
    downloaded, the kit's tokenizer is left alone, and ours goes beside the dataset."""
    files = climbmix_files(prepare_module, sample_home, limit=200)
    home = tmp_path / "home"
    val = prepare_module.shard_name(prepare_module.VAL_SHARD)
    (home / "data").mkdir(parents=True)
    (home / "data" / prepare_module.shard_name(0)).write_bytes(files[prepare_module.shard_name(0)])
    (home / "datasets" / "climbmix" / "shards").mkdir(parents=True)
    (home / "datasets" / "climbmix" / "shards" / val).write_bytes(files[val])
    (home / "tokenizer").mkdir()
    (home / "tokenizer" / "tokenizer.pkl").write_bytes(b"the organisers' tokenizer")
    with FaultyServer(files) as running:
        monkeypatch.setenv("TRNF_CLIMBMIX_URL", running.url)
        result = prepare_module.setup("climbmix", num_train_shards=1, home=home, backoff=TINY_BACKOFF)
        assert running.requests == []
    assert sorted(p.name for p in (home / "data").iterdir()) == sorted(files)
    assert (home / "tokenizer" / "tokenizer.pkl").read_bytes() == b"the organisers' tokenizer"
    assert result["tokenizer_path"] == str(home / "datasets" / "climbmix" / "tokenizer" / "tokenizer.pkl")
    assert result["tokenizer_sha256"] == prepare_module.TOKENIZER_ARTIFACT_SHA256
    monkeypatch.setenv("TRNF_HOME", str(home))
    monkeypatch.setenv("TRNF_DATASET", "climbmix")
    assert prepare_module.ensure_tokenizer().get_bos_token_id() == 8188
