import functools
import hashlib
import http.server
import pickle
import tarfile
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from audit import data as data_mod
from audit.data import (SOURCES, embedded_sample, embedded_sample_indices, load_dataset, locate)
from audit.errors import AuditError, ConfigError, DataError
from audit.formats import read_idx
from tests.helpers import write_cifar_batches, write_idx, write_mnist_split


# --- IDX ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gz", [True, False])
def test_idx_split_round_trip(isolated_data_env, gz):
    root = isolated_data_env / "d"
    images, labels = write_mnist_split(root, "train", 12, seed=1, gz=gz)
    x, y = load_dataset("mnist", "train", root=root)
    assert x.dtype == np.float32 and x.shape == (12, 1, 28, 28)
    assert y.dtype == np.int64 and y.tolist() == labels.tolist()
    np.testing.assert_array_equal(x[:, 0], images.astype(np.float32) / 255)
    assert 0.0 <= x.min() and x.max() <= 1.0


def test_idx_rejects_bad_magic(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"\x01\x02\x08\x01" + b"\x00" * 8)
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(p)


def test_idx_rejects_truncated_raw_file(tmp_path):
    p = write_idx(tmp_path / "f", np.zeros((5, 4, 4), np.uint8))
    p.write_bytes(p.read_bytes()[:-7])
    with pytest.raises(DataError, match="truncated"):
        read_idx(p)


def test_idx_rejects_truncated_gzip(tmp_path):
    p = write_idx(tmp_path / "f.gz", np.arange(400, dtype=np.uint8).reshape(4, 10, 10) % 7, gz=True)
    p.write_bytes(p.read_bytes()[:30])
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        read_idx(p)


def test_image_label_count_mismatch(isolated_data_env):
    root = isolated_data_env / "d"
    write_mnist_split(root, "test", 6, seed=0)
    write_idx(root / "t10k-labels-idx1-ubyte.gz", np.zeros(5, np.uint8), gz=True)
    with pytest.raises(DataError, match="do not form"):
        load_dataset("mnist", "test", root=root)


# --- lookup ---------------------------------------------------------------------------------------

def test_lookup_order_root_then_env_then_cache(isolated_data_env, monkeypatch):
    tmp = isolated_data_env
    write_mnist_split(tmp / "root", "test", 3, seed=1)
    write_mnist_split(tmp / "env" / "mnist", "test", 4, seed=2)
    write_mnist_split(tmp / "cache" / "attribution-audit" / "mnist", "test", 5, seed=3)
    monkeypatch.setenv("AUDIT_DATA", str(tmp / "env"))
    assert len(load_dataset("mnist", "test", root=tmp / "root")[0]) == 3
    assert len(load_dataset("mnist", "test")[0]) == 4
    monkeypatch.delenv("AUDIT_DATA")
    assert len(load_dataset("mnist", "test")[0]) == 5


def test_missing_files_error_says_what_where_and_how(isolated_data_env):
    with pytest.raises(DataError) as err:
        load_dataset("mnist", "train", root=isolated_data_env / "nowhere")
    text = str(err.value)
    assert "train-images-idx3-ubyte" in text
    assert str(isolated_data_env / "nowhere") in text
    assert SOURCES["mnist"].base_url in text and "download=True" in text


def test_missing_fashion_mnist_error_names_the_debian_package(isolated_data_env, monkeypatch):
    monkeypatch.setitem(SOURCES, "fashion-mnist", replace(SOURCES["fashion-mnist"], system_dirs=()))
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        locate("fashion-mnist", "test", isolated_data_env)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(DataError, match="valid: .*fashion-mnist.*mnist") as err:
        load_dataset("fashon-mnist", "train")
    assert "Did you mean 'fashion-mnist'" in str(err.value)
    with pytest.raises(ConfigError, match="split"):
        load_dataset("mnist", "validation")
    assert issubclass(DataError, AuditError)


# --- CIFAR ----------------------------------------------------------------------------------------

def test_cifar_batches(isolated_data_env):
    folder = isolated_data_env / "c" / "cifar-10-batches-py"
    written = write_cifar_batches(folder, per_batch=4, seed=0)
    x, y = load_dataset("cifar10", "train", root=isolated_data_env / "c")
    assert x.shape == (20, 3, 32, 32) and y.shape == (20,)
    np.testing.assert_array_equal(x[4:8].reshape(4, -1) * 255, written["data_batch_2"][0].astype(np.float32))
    assert y[:4].tolist() == written["data_batch_1"][1]
    xt, yt = load_dataset("cifar10", "test", root=folder)
    assert xt.shape == (4, 3, 32, 32) and yt.tolist() == written["test_batch"][1]


def test_cifar_corrupt_batch(isolated_data_env):
    folder = isolated_data_env / "cifar-10-batches-py"
    write_cifar_batches(folder, per_batch=2, seed=0)
    (folder / "test_batch").write_bytes((folder / "test_batch").read_bytes()[:50])
    with pytest.raises(DataError, match="test_batch"):
        load_dataset("cifar10", "test", root=isolated_data_env)


def test_cifar_batch_cannot_run_code(isolated_data_env):
    class Evil:
        def __reduce__(self):
            return (Path.touch, (isolated_data_env / "pwned",))

    folder = isolated_data_env / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(DataError, match="refusing"):
        load_dataset("cifar10", "test", root=isolated_data_env)
    assert not (isolated_data_env / "pwned").exists()


# --- image folder ---------------------------------------------------------------------------------

def _png(path: Path, value: int, size=(6, 5), mode="L"):
    path.parent.mkdir(parents=True, exist_ok=True)
    color = value if mode == "L" else (value, 0, 255 - value)
    Image.new(mode, size, color).save(path)


def test_image_folder_gray_and_rgb(tmp_path):
    _png(tmp_path / "g" / "train" / "cat" / "a.png", 10)
    _png(tmp_path / "g" / "train" / "dog" / "b.png", 200)
    _png(tmp_path / "g" / "train" / "dog" / "c.png", 100)
    x, y = load_dataset("imagefolder", "train", root=tmp_path / "g")
    assert x.shape == (3, 1, 5, 6) and y.tolist() == [0, 1, 1]
    assert x[1, 0, 0, 0] == pytest.approx(200 / 255)
    _png(tmp_path / "c" / "a" / "x.png", 50, mode="RGB")
    xc, _ = load_dataset("imagefolder", "test", root=tmp_path / "c")
    assert xc.shape == (1, 3, 5, 6) and xc[0, 2, 0, 0] == pytest.approx(205 / 255)


def test_image_folder_empty_and_mixed_sizes(tmp_path):
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(DataError, match="no images found"):
        load_dataset("imagefolder", "train", root=tmp_path / "empty")
    _png(tmp_path / "m" / "a" / "1.png", 1, size=(4, 4))
    _png(tmp_path / "m" / "b" / "2.png", 1, size=(5, 4))
    with pytest.raises(DataError, match="different sizes"):
        load_dataset("imagefolder", "train", root=tmp_path / "m")


# --- download -------------------------------------------------------------------------------------

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


# --- embedded sample and the full data set ---------------------------------------------------------

def test_embedded_sample_is_balanced_real_fashion_mnist():
    x, y = embedded_sample()
    assert x.shape == (1000, 1, 28, 28) and x.dtype == np.float32
    assert np.bincount(y, minlength=10).tolist() == [100] * 10
    assert len(set(embedded_sample_indices().tolist())) == 1000
    licence = Path(data_mod.__file__).parent / "assets" / "FASHION-MNIST-LICENSE"
    assert "MIT" in licence.read_text() and "Zalando" in licence.read_text()
    xtr, ytr = load_dataset("fashion-mnist-sample", "train")
    xte, yte = load_dataset("fashion-mnist-sample", "test")
    assert len(xtr) == 800 and len(xte) == 200
    assert np.bincount(yte).tolist() == [20] * 10


def test_full_debian_fashion_mnist(full_fashion_mnist, isolated_data_env):
    x, y = load_dataset("fashion-mnist", "train")
    xt, yt = load_dataset("fashion-mnist", "test")
    assert x.shape == (60000, 1, 28, 28) and xt.shape == (10000, 1, 28, 28)
    assert np.bincount(y).tolist() == [6000] * 10
    assert np.bincount(yt).tolist() == [1000] * 10
    # The embedded sample is exactly the recorded slice of the official test split.
    xs, ys = embedded_sample()
    idx = embedded_sample_indices()
    np.testing.assert_array_equal(xs, xt[idx])
    np.testing.assert_array_equal(ys, yt[idx])
