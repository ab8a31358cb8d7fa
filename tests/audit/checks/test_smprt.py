"""sMPRT: the noisy copies, stage 0 and the controls, and the plain MPRT as its one-sample case."""
import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from attributions.explainer import Explainer
from audit import parameter_randomization, smooth_mprt
from audit.checks.base import INCONCLUSIVE, NOT_REJECTED, REJECTED
from audit.checks.smprt import CHECK, SmprtOptions, noisy_copies
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
    assert list(df.columns) == ["method", "stage", "layer", "image", "replicate", "spearman", "unrelated_spearman",
                                "share"]
    assert np.allclose(df[df.stage == 0].spearman, 1.0)
    edge = df[df.method == "edge"]
    assert np.allclose(edge.spearman, 1.0)  # the same noise at every stage: the edge map never changes
    last = df[(df.method == "gradient") & (df.stage == df.stage.max())].spearman.median()
    assert last < 0.5


def test_the_unrelated_floor_is_the_next_image_of_the_seed_and_calibrates_the_verdict(trained):
    model, x, y = trained
    df = smooth_mprt(model, x[:4], y[:4], ["gradient", "edge"], seed=0, n_samples=4, progress=False)
    edge = df[df.method == "edge"]
    # by hand: the denoised edge maps of images 0 and 1 (one seed, replicate 0, keeps the run's seed 0)
    copies = noisy_copies(x[:2], 4, 0.1, 0)
    maps = Explainer(model, "edge").attribute(copies.reshape(-1, *x.shape[1:]), target=y[:2].repeat(4))
    denoised = maps.reshape(4, 2, *x.shape[1:]).mean(0).abs().flatten(1)
    rho = stats.spearmanr(denoised[0], denoised[1]).statistic
    # the pair is read both ways, and the edge map never changes: the same at every stage
    assert np.allclose(edge[edge.image.isin([0, 1])].unrelated_spearman, rho, rtol=1e-9)
    assert not np.isclose(edge[edge.image == 2].unrelated_spearman.iloc[0], rho)  # images 2 and 3: another pair
    options = SmprtOptions()
    cell = CHECK.verdict.evaluate(edge, options)  # the edge map lies at its trained map itself: rejected
    assert cell.outcome == REJECTED and "unrelated" in cell.text
    single = smooth_mprt(model, x[:2], y[:2], ["edge"], seed=0, n_samples=2, images_per_seed=1, progress=False)
    assert single.unrelated_spearman.isna().all()
    fallback = CHECK.verdict.evaluate(single, options)  # on the measure's own ends, no fixed threshold
    assert "no unrelated map measured" in fallback.text and not fallback.decided_by


def test_the_smprt_verdict_reads_each_image_between_its_trained_map_and_an_unrelated_one():
    n = 40
    rows = lambda score, unrelated: pd.DataFrame({"stage": 1, "image": np.arange(n), "replicate": np.arange(n) // 2,  # noqa: E731
                                                  "spearman": score + 0.01 * np.sin(np.arange(n)),
                                                  "unrelated_spearman": unrelated + 0.01 * np.cos(np.arange(n))})
    options = SmprtOptions()
    # 0.6 against an unrelated 0.4 (halfway 0.7): not rejected
    cell = CHECK.verdict.evaluate(rows(0.6, 0.4), options)
    assert cell.outcome == NOT_REJECTED and "unrelated 0.4" in cell.text
    assert CHECK.verdict.evaluate(rows(0.45, -0.2), options).outcome == REJECTED  # halfway 0.4
    assert CHECK.verdict.evaluate(rows(0.7, 0.4), options).outcome == INCONCLUSIVE  # at halfway
