"""Image folders read on demand: the same inputs as the audit's reading of the folder, one image at a time, with
clear errors for a folder without images and an image of another size."""
import numpy as np
import pytest
import torch
from PIL import Image

from audit.data.datasets import load_dataset
from audit.data.preprocess import PRESETS
from audit.data.stream import FolderImages
from audit.errors import DataError


def _folder(root, classes=3, per_class=4, size=(12, 10), mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(root / f"c{c}" / f"{i}.png")
    return root


@pytest.mark.parametrize("mode, channels", [("RGB", 3), ("L", 1)])
def test_each_image_is_the_input_the_audit_reads_from_the_folder(tmp_path, mode, channels):
    root = _folder(tmp_path / "f", mode=mode)
    images = FolderImages(root)
    x, y = load_dataset("imagefolder", "train", root)
    assert len(images) == 12 and images.classes == ["c0", "c1", "c2"] and images.shape == (channels, 10, 12)
    np.testing.assert_array_equal(images.labels, y)
    for i in range(len(images)):
        image, label = images[i]
        assert image.dtype == torch.float32 and label == y[i]
        np.testing.assert_array_equal(image.numpy(), x[i])


def test_a_preprocessing_resizes_crops_and_normalises_as_in_an_audit(tmp_path):
    root = _folder(tmp_path / "f", size=(300, 260))
    images = FolderImages(root, PRESETS["imagenet"])
    assert images.shape == (3, 224, 224)
    expected = PRESETS["imagenet"](Image.open(images.files[5]), 3)
    np.testing.assert_array_equal(images[5][0].numpy(), expected)


def test_a_folder_without_images_or_with_an_image_of_another_size_is_refused(tmp_path):
    (tmp_path / "empty" / "c0").mkdir(parents=True)
    with pytest.raises(DataError, match="no images found"):
        FolderImages(tmp_path / "empty")
    root = _folder(tmp_path / "f")
    Image.fromarray(np.zeros((7, 7, 3), dtype=np.uint8)).save(root / "c2" / "odd.png")
    images = FolderImages(root)
    odd = next(i for i, f in enumerate(images.files) if f.name == "odd.png")
    with pytest.raises(DataError, match=r"odd.png gives an input of shape \[3, 7, 7\], the folder's first image "
                                        r"\[3, 10, 12\]"):
        images[odd]
