"""Preprocessing image files (resize, centre crop, normalisation; presets) and the stratified,
seeded draw from a class-per-folder tree."""
import zlib

import numpy as np
import pytest
from PIL import Image

from audit.data.datasets import sample_image_folder
from audit.data.preprocess import PRESETS, Preprocess, preprocess_from
from audit.errors import ConfigError, DataError


def picture(w: int, h: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_imagenet_preset_is_resize_crop_and_normalise():
    image = picture(300, 400)
    x = PRESETS["imagenet"](image, 3)
    assert x.shape == (3, 224, 224) and x.dtype == np.float32
    # by hand: shorter side to 256 (bilinear, PIL), the centred 224 square, / 255, (x - mean) / std
    resized = np.asarray(image.resize((256, 341), Image.Resampling.BILINEAR), dtype=np.float32) / 255
    top, left = (341 - 224) // 2, (256 - 224) // 2
    crop = resized[top:top + 224, left:left + 224].transpose(2, 0, 1)
    mean, std = np.array([0.485, 0.456, 0.406])[:, None, None], np.array([0.229, 0.224, 0.225])[:, None, None]
    assert np.allclose(x, (crop - mean) / std, atol=1e-6)
    assert np.allclose(PRESETS["imagenet"].picture(x), crop, atol=1e-6)  # the picture undoes the normalisation


def test_none_keeps_the_size_and_scales_to_unit_range():
    x = preprocess_from("none")(picture(20, 10), 1)
    assert x.shape == (1, 10, 20) and 0 <= x.min() and x.max() <= 1


@pytest.mark.parametrize("spec,message", [
    ("imagenett", "unknown preprocess preset 'imagenett'"),
    ({"resize": -1}, "resize must be a positive integer.*-1"),
    ({"crop": 2.5}, "crop.*2.5"),
    ({"mean": [0.5]}, "both mean and std"),
    ({"mean": [0.5, 0.5], "std": [1, 1]}, "one value or one per channel"),
    ({"mean": 0.5, "std": 0}, "std must be positive"),
    ({"mean": "grey", "std": 1}, "mean must be a number or a list"),
    ({"scale": 2}, "no key scale"),
    (3, "preset name or a table, got 3"),
])
def test_bad_specs_are_named(spec, message):
    with pytest.raises(ConfigError, match=message):
        preprocess_from(spec)


def test_a_crop_larger_than_the_image_is_an_error():
    with pytest.raises(ConfigError, match="crop 64 is larger than the image"):
        Preprocess(crop=64)(picture(32, 32), 3)


def make_folder(root, counts: dict[str, int], size=(12, 12)):
    for c, k in counts.items():
        (root / c).mkdir(parents=True)
        for i in range(k):
            picture(*size, seed=zlib.crc32(f"{c}{i}".encode())).save(root / c / f"{i:03d}.png")
    (root / "notes.txt").write_text("not a class")
    return root


def test_the_draw_is_stratified_seeded_and_reads_only_what_it_draws(tmp_path):
    root = make_folder(tmp_path / "f", {"cat": 5, "dog": 2, "eel": 4})
    a = sample_image_folder(root, 7, seed=1)
    assert a.classes == ["cat", "dog", "eel"] and a.x.shape == (7, 3, 12, 12)
    assert list(a.y) == [0, 1, 2, 0, 1, 2, 0]  # classes take turns; dog runs out after two
    assert all(f.startswith(("cat/", "dog/", "eel/")) for f in a.files) and len(set(a.files)) == 7
    again = sample_image_folder(root, 7, seed=1)
    assert again.files == a.files and np.array_equal(again.x, a.x)
    assert sample_image_folder(root, 7, seed=2).files != a.files
    (root / "eel" / "999.png").write_bytes(b"not an image")  # a broken file is named when (and only if) drawn
    with pytest.raises(DataError, match="999.png"):
        sample_image_folder(root, 11, seed=1)


def test_folder_errors_name_the_problem(tmp_path):
    root = make_folder(tmp_path / "f", {"a": 2, "b": 2})
    with pytest.raises(DataError, match="5 images asked for.*holds 4"):
        sample_image_folder(root, 5)
    with pytest.raises(DataError, match="not found"):
        sample_image_folder(tmp_path / "nowhere", 2)
    picture(20, 16).save(root / "b" / "big.png")
    with pytest.raises(DataError, match="different sizes.*resize and crop"):
        sample_image_folder(root, 5, seed=0)
    assert sample_image_folder(root, 5, preprocess={"resize": 8, "crop": 8}).x.shape == (5, 3, 8, 8)
