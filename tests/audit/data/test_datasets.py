"""Data set lookup, loading and the embedded sample."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from audit.data import datasets as data_mod
from audit.data.datasets import (
    SOURCES,
    embedded_sample,
    embedded_sample_indices,
    load_dataset,
    locate,
)
from audit.errors import AuditError, ConfigError, DataError
from tests.helpers import write_cifar_batches, write_idx, write_mnist_split


@pytest.mark.parametrize("gz", [True, False])
def test_idx_split_round_trip(isolated_data_env, gz):
    root = isolated_data_env / "d"
    images, labels = write_mnist_split(root, "train", 12, seed=1, gz=gz)
    x, y = load_dataset("mnist", "train", root=root)
    assert x.dtype == np.float32 and x.shape == (12, 1, 28, 28)
    assert y.dtype == np.int64 and y.tolist() == labels.tolist()
    np.testing.assert_array_equal(x[:, 0], images.astype(np.float32) / 255)
    assert 0.0 <= x.min() and x.max() <= 1.0


def test_image_label_count_mismatch(isolated_data_env):
    root = isolated_data_env / "d"
    write_mnist_split(root, "test", 6, seed=0)
    write_idx(root / "t10k-labels-idx1-ubyte.gz", np.zeros(5, np.uint8), gz=True)
    with pytest.raises(DataError, match="do not form"):
        load_dataset("mnist", "test", root=root)


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


def test_cifar_batches(isolated_data_env):
    folder = isolated_data_env / "c" / "cifar-10-batches-py"
    written = write_cifar_batches(folder, per_batch=4, seed=0)
    x, y = load_dataset("cifar10", "train", root=isolated_data_env / "c")
    assert x.shape == (20, 3, 32, 32) and y.shape == (20,)
    np.testing.assert_array_equal(x[4:8].reshape(4, -1) * 255, written["data_batch_2"][0].astype(np.float32))
    assert y[:4].tolist() == written["data_batch_1"][1]
    xt, yt = load_dataset("cifar10", "test", root=folder)
    assert xt.shape == (4, 3, 32, 32) and yt.tolist() == written["test_batch"][1]


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



def test_a_data_root_missing_one_file_is_an_error_not_another_copy(isolated_data_env, monkeypatch):
    tmp = isolated_data_env
    write_mnist_split(tmp / "cache" / "attribution-audit" / "mnist", "test", 5, seed=3)  # a complete copy elsewhere
    write_mnist_split(tmp / "mine", "test", 3, seed=1)
    (tmp / "mine" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match=r"mine holds part of the mnist test split but not t10k-labels-idx1-ubyte"):
        load_dataset("mnist", "test", root=tmp / "mine")
    assert len(load_dataset("mnist", "test")[0]) == 5  # without --data-root the complete copy is found
