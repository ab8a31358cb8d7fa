"""Similarity of attribution maps: heatmap reduction, normalisation, batched SSIM, rank correlations.

``ssim`` is scikit-image's ``structural_similarity`` (2-D, one channel) computed for a batch of
maps at once in torch: the same filters, constants and cropping, so the two agree to float64
rounding. Only windows lying fully inside the image enter the mean (scikit-image crops the
filter radius), so no padding is needed.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

REDUCTIONS = ("sum", "max-abs")


def reduce_map(maps: torch.Tensor, mode: str) -> torch.Tensor:
    """(N, C, H, W) attribution maps -> (N, H, W) heatmaps.

    ``sum``: signed sum over channels (relevance, contributions); ``max-abs``: the largest
    magnitude over channels (gradient-like maps).
    """
    if mode == "sum":
        return maps.sum(1)
    if mode == "max-abs":
        return maps.abs().amax(1)
    from audit.errors import ConfigError
    raise ConfigError(f"unknown heatmap reduction {mode!r}; valid: {', '.join(REDUCTIONS)}")


def normalize_map(maps: torch.Tensor, low: float = 0.5, high: float = 99.5) -> torch.Tensor:
    """Clip each (H, W) map of (N, H, W) at its ``low`` / ``high`` percentiles, then min-max to [0, 1].

    A constant map becomes all zeros.
    """
    flat = maps.reshape(maps.shape[0], -1).double()
    q = torch.quantile(flat, torch.tensor([low / 100, high / 100], dtype=flat.dtype), dim=1)
    clipped = flat.clamp(min=q[0][:, None], max=q[1][:, None])
    lo, hi = clipped.amin(1, keepdim=True), clipped.amax(1, keepdim=True)
    span = hi - lo
    out = torch.where(span > 0, (clipped - lo) / torch.where(span > 0, span, 1.0), torch.zeros_like(clipped))
    return out.reshape(maps.shape).to(maps.dtype)


def _gaussian_kernel(sigma: float, truncate: float, dtype) -> torch.Tensor:
    radius = int(truncate * sigma + 0.5)
    x = torch.arange(-radius, radius + 1, dtype=dtype)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def _box_mean(x: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """Valid-mode moving average along ``dim`` by differences of a cumulative sum (O(1) per value)."""
    c = torch.cumsum(x, dim=dim)
    c = torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c], dim=dim)
    n = x.shape[dim] - size + 1
    return (c.narrow(dim, size, n) - c.narrow(dim, 0, n)) / size


def _filter(x: torch.Tensor, win_size: int, gaussian: bool, sigma: float) -> torch.Tensor:
    """Valid-mode local means over the last two axes: a uniform box or a separable Gaussian window."""
    if not gaussian:
        return _box_mean(_box_mean(x, win_size, -1), win_size, -2)
    k = _gaussian_kernel(sigma, 3.5, x.dtype)
    shape = x.shape
    x = x.reshape(-1, 1, *shape[-2:])
    x = F.conv2d(F.conv2d(x, k.reshape(1, 1, -1, 1)), k.reshape(1, 1, 1, -1))
    return x.reshape(*shape[:-2], *x.shape[-2:])


def ssim(a: torch.Tensor, b: torch.Tensor, win_size: int | None = 5, data_range: float = 1.0,
         gaussian: bool = False, flip_invariant: bool = False, sigma: float = 1.5,
         use_sample_covariance: bool = True) -> torch.Tensor:
    """Mean structural similarity of each pair of maps.

    Parameters
    ----------
    a, b : (N, H, W) tensors
    win_size : odd window side (ignored with ``gaussian``, whose window is 2 * int(3.5 sigma + 0.5) + 1)
    data_range : the maps' value range (1 for normalised maps)
    gaussian : Gaussian-weighted windows (sigma 1.5) instead of a uniform box
    flip_invariant : the larger of SSIM(a, b) and SSIM(a, data_range - b): for maps normalised to
        [0, data_range] with symmetric percentile clipping, data_range - b is the normalised -b
    use_sample_covariance : divide covariances by NP - 1 (scikit-image's default)

    Returns
    -------
    (N,) tensor of SSIM values, as ``skimage.metrics.structural_similarity`` with the same settings.
    """
    if a.shape != b.shape or a.ndim != 3:
        from audit.errors import AuditError
        raise AuditError(f"ssim needs two (N, H, W) tensors of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if gaussian:
        win_size = 2 * int(3.5 * sigma + 0.5) + 1
    if win_size % 2 != 1 or win_size > min(a.shape[1:]):
        from audit.errors import AuditError
        raise AuditError(f"win_size must be odd and at most the map side {min(a.shape[1:])}, got {win_size}")
    if flip_invariant:
        return torch.maximum(ssim(a, b, win_size, data_range, gaussian, False, sigma, use_sample_covariance),
                             ssim(a, data_range - b, win_size, data_range, gaussian, False, sigma,
                                  use_sample_covariance))
    x, y = a.double(), b.double()
    ux, uy, uxx, uyy, uxy = _filter(torch.stack([x, y, x * x, y * y, x * y]), win_size, gaussian, sigma).unbind(0)
    n = win_size ** 2
    cov_norm = n / (n - 1) if use_sample_covariance else 1.0
    vx, vy, vxy = cov_norm * (uxx - ux * ux), cov_norm * (uyy - uy * uy), cov_norm * (uxy - ux * uy)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.mean(dim=(1, 2)).to(a.dtype if a.is_floating_point() else torch.float64)


def spearman(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Spearman rank correlation of each pair of flattened maps (N, ...) -> (N,) (scipy, average ranks)."""
    ra = stats.rankdata(a.reshape(a.shape[0], -1).double().numpy(), axis=1)
    rb = stats.rankdata(b.reshape(b.shape[0], -1).double().numpy(), axis=1)
    ra -= ra.mean(1, keepdims=True)
    rb -= rb.mean(1, keepdims=True)
    den = np.sqrt((ra * ra).sum(1) * (rb * rb).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(1) / den, np.nan)


def hog_features(maps: torch.Tensor, orientations: int = 9) -> np.ndarray:
    """scikit-image HOG descriptors of (N, H, W) maps: cells of about a quarter of the side, 2x2 blocks."""
    from skimage.feature import hog

    cell = max(2, min(maps.shape[1:]) // 4)
    return np.stack([hog(m, orientations=orientations, pixels_per_cell=(cell, cell), cells_per_block=(2, 2),
                         feature_vector=True) for m in maps.double().numpy()])


def hog_similarity(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Spearman correlation of the HOG descriptors of each pair of (N, H, W) maps -> (N,)."""
    return spearman(torch.from_numpy(hog_features(a)), torch.from_numpy(hog_features(b)))
