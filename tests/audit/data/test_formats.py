"""Readers of IDX, CIFAR pickles and image folders: round trips and corrupt files."""
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from audit.data.datasets import load_dataset
from audit.data.formats import read_idx
from audit.errors import DataError
from tests.helpers import write_cifar_batches, write_idx


def _png(path: Path, value: int, size=(6, 5), mode="L"):
    path.parent.mkdir(parents=True, exist_ok=True)
    color = value if mode == "L" else (value, 0, 255 - value)
    Image.new(mode, size, color).save(path)


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



def test_sixteen_bit_images_keep_their_full_range_and_bombs_are_refused(tmp_path, monkeypatch):
    from audit.data.datasets import sample_image_folder
    from audit.data.formats import open_image, read_image_folder

    values = np.linspace(0, 65535, 64, dtype=np.uint16).reshape(8, 8)
    for c in ("a", "b"):
        (tmp_path / "deep" / c).mkdir(parents=True)
        Image.fromarray(values).save(tmp_path / "deep" / c / "x.png")
    assert open_image(tmp_path / "deep" / "a" / "x.png").mode in ("I;16", "I")
    sample = sample_image_folder(tmp_path / "deep", 2)
    assert sample.x.shape == (2, 1, 8, 8) and sample.x.max() == 1.0 and sample.x.min() == 0.0
    assert len(np.unique(sample.x[0])) == 64  # no value clipped at 255 / 65535
    x, _, _ = read_image_folder(tmp_path / "deep")
    assert x.dtype == np.uint8 and x.max() == 255 and len(np.unique(x[0])) > 50
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 16)  # 64 pixels: beyond twice the limit, a "bomb"
    with pytest.raises(DataError, match="beyond PIL's safety limit against decompression bombs"):
        open_image(tmp_path / "deep" / "a" / "x.png")
