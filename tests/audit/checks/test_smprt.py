"""sMPRT: the noisy copies, stage 0 and the controls, and the plain MPRT as its one-sample case."""
import numpy as np
import pytest
import torch

from audit import parameter_randomization, smooth_mprt
from audit.checks.smprt import noisy_copies
from audit.errors import ConfigError


def test_noisy_copies_are_seeded_scaled_and_end_noise_free():
    x = torch.rand(4, 1, 20, 20, dtype=torch.float64) * torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(4, 1, 1, 1)
    copies = noisy_copies(x, 200, 0.1, seed=5)
    assert copies.shape == (200, 4, 1, 20, 20) and torch.equal(copies[-1], x)
    assert torch.equal(copies, noisy_copies(x, 200, 0.1, seed=5))
    ranges = (x.flatten(1).max(1).values - x.flatten(1).min(1).values)
    std = (copies[:-1] - x).transpose(0, 1).flatten(1).std(1)
    np.testing.assert_allclose(std, 0.1 * ranges, rtol=0.02)
    with pytest.raises(ConfigError):
        noisy_copies(x, 0, 0.1, seed=0)


def test_smooth_mprt_with_one_sample_is_the_plain_mprt(trained):
    model, x, y = trained
    df = smooth_mprt(model, x, y, ["gradient", "edge"], seed=0, n_samples=1, progress=False)
    plain = parameter_randomization(model, x, y, ["gradient", "edge"], order="bottom-up", seed=0, progress=False)
    key = ["method", "stage", "image"]
    merged = df.merge(plain[key + ["spearman_abs"]], on=key)
    assert len(merged) == len(df) == len(plain)
    np.testing.assert_allclose(merged.spearman, merged.spearman_abs, rtol=1e-12)


def test_smooth_mprt_stage_zero_controls_and_denoising(trained):
    model, x, y = trained
    df = smooth_mprt(model, x, y, ["gradient", "edge"], seed=0, n_samples=8, progress=False)
    assert list(df.columns) == ["method", "stage", "layer", "image", "replicate", "spearman", "share"]
    assert np.allclose(df[df.stage == 0].spearman, 1.0)
    edge = df[df.method == "edge"]
    assert np.allclose(edge.spearman, 1.0)  # the same noise at every stage: the edge map never changes
    last = df[(df.method == "gradient") & (df.stage == df.stage.max())].spearman.median()
    assert last < 0.5
