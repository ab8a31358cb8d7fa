"""Verified, atomic downloads against a local file server."""
import functools
import hashlib
import http.server
import tarfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from audit.data.datasets import (
    SOURCES,
    load_dataset,
)
from audit.errors import DataError
from tests.helpers import write_cifar_batches, write_mnist_split


@pytest.fixture
def file_server(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/served; yields (folder, base_url)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_verified_and_atomic(isolated_data_env, file_server, monkeypatch):
    served, url = file_server
    for split in ("train", "test"):
        write_mnist_split(served, split, 7, seed=4)
    files = {p.name: _sha(p) for p in served.iterdir()}
    monkeypatch.setitem(SOURCES, "mnist", replace(SOURCES["mnist"], base_url=url, files=files))
    dest = isolated_data_env / "dl"
    with pytest.raises(DataError):
        load_dataset("mnist", "train", root=dest)  # not there, and no download asked for
    x, y = load_dataset("mnist", "train", root=dest, download=True)
    assert x.shape == (7, 1, 28, 28)
    assert sorted(p.name for p in (dest / "mnist").iterdir()) == sorted(files)


def test_download_checksum_mismatch_leaves_nothing(isolated_data_env, file_server, monkeypatch):
    served, url = file_server
    write_mnist_split(served, "test", 3, seed=5)
    write_mnist_split(served, "train", 3, seed=5)
    files = {p.name: "0" * 64 for p in served.iterdir()}
    monkeypatch.setitem(SOURCES, "mnist", replace(SOURCES["mnist"], base_url=url, files=files))
    dest = isolated_data_env / "dl"
    with pytest.raises(DataError, match="checksum mismatch"):
        load_dataset("mnist", "test", root=dest, download=True)
    assert list((dest / "mnist").iterdir()) == []


def test_download_unreachable_server_is_a_clear_error(isolated_data_env, monkeypatch):
    monkeypatch.setitem(SOURCES, "mnist", replace(SOURCES["mnist"], base_url="http://127.0.0.1:9/"))
    with pytest.raises(DataError, match="could not download"):
        load_dataset("mnist", "test", root=isolated_data_env / "dl", download=True)


def test_download_cifar_archive(isolated_data_env, file_server, monkeypatch):
    served, url = file_server
    build = isolated_data_env / "build"
    write_cifar_batches(build / "cifar-10-batches-py", per_batch=3, seed=6)
    with tarfile.open(served / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(build / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    files = {"cifar-10-python.tar.gz": _sha(served / "cifar-10-python.tar.gz")}
    monkeypatch.setitem(SOURCES, "cifar10", replace(SOURCES["cifar10"], base_url=url, files=files))
    x, y = load_dataset("cifar10", "test", root=isolated_data_env / "dl", download=True)
    assert x.shape == (3, 3, 32, 32)
    assert (isolated_data_env / "dl" / "cifar10" / "cifar-10-batches-py" / "data_batch_5").is_file()

