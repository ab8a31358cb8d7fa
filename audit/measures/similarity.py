"""Similarity of attribution maps: heatmap reduction, normalisation, batched SSIM, rank correlations.

``ssim`` is scikit-image's ``structural_similarity`` (2-D, one channel) computed for a batch of
maps at once in torch: the same windows, constants and cropping, so the two agree to float64
rounding. Only windows lying fully inside the image enter the mean (scikit-image crops the
filter radius), so no padding is needed.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from skimage.feature import hog

from audit.errors import AuditError, ConfigError

REDUCTIONS = ("sum", "max-abs")
# SSIM's constants as Wang et al. 2004 and scikit-image define them: C1 = (K1 L)^2, C2 = (K2 L)^2.
K1, K2 = 0.01, 0.03
WINDOW = 5  # the uniform window side of the random-logit and randomization checks (Sixt et al. 2020)
GAUSSIAN_SIGMA = 1.5
GAUSSIAN_TRUNCATE = 3.5  # scikit-image's Gaussian window: radius int(truncate * sigma + 0.5)


def reduce_map(maps: torch.Tensor, mode: str) -> torch.Tensor:
    """(N, C, H, W) attribution maps -> (N, H, W) heatmaps.

    ``sum``: signed sum over channels (relevance, contributions); ``max-abs``: the largest
    magnitude over channels (gradient-like maps).
    """
    if mode == "sum":
        return maps.sum(1)
    if mode == "max-abs":
        return maps.abs().amax(1)
    raise ConfigError(f"unknown heatmap reduction {mode!r}; valid: {', '.join(REDUCTIONS)}")


def degenerate(maps: torch.Tensor) -> np.ndarray:
    """Which maps of (N, ...) carry no information to compare: constant (all zero included) or holding
    NaN / inf. Their similarity scores are undefined (NaN), never a pass or a fail: two all-zero maps
    are "identical" only because nothing was computed. -> (N,) bool."""
    flat = maps.reshape(maps.shape[0], -1)
    finite = torch.isfinite(flat).all(1)
    safe = torch.where(torch.isfinite(flat), flat, 0)
    constant = safe.amax(1) == safe.amin(1)
    return (~finite | constant).numpy()


def screen(maps: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """(:func:`degenerate` mask (N,), the maps with NaN / inf set to 0 so the measures can run on them)."""
    return degenerate(maps), torch.nan_to_num(maps, 0.0, 0.0, 0.0)


def undefined_where(bad: np.ndarray, scores: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``scores`` (each (N,)) with NaN for the images marked ``bad``."""
    return {k: np.where(bad, np.nan, np.asarray(v, dtype=float)) for k, v in scores.items()}


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


def _window(win_size: int, gaussian: bool, sigma: float) -> torch.Tensor:
    """1-D window weights: a uniform box, or scikit-image's Gaussian (truncate 3.5, normalised)."""
    if not gaussian:
        return torch.full((win_size,), 1.0 / win_size, dtype=torch.float64)
    radius = int(GAUSSIAN_TRUNCATE * sigma + 0.5)
    k = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=torch.float64) / sigma) ** 2)
    return k / k.sum()


def _band(n: int, window: torch.Tensor) -> torch.Tensor:
    """(n, n - len + 1) matrix whose columns are the window at each valid offset."""
    k = len(window)
    band = torch.zeros(n, n - k + 1, dtype=window.dtype)
    for j in range(n - k + 1):
        band[j:j + k, j] = window
    return band


def _filter(x: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Valid-mode separable local means over the last two axes.

    Small maps: two products with banded matrices (on the CPU much faster than pooling or
    cumulative sums of many small maps). Large maps, where the band's cost grows with the side:
    shifted multiply-adds, one per tap, in place (measured the fastest there).
    """
    if max(x.shape[-2:]) <= 64:
        return _band(x.shape[-2], window).T @ (x @ _band(x.shape[-1], window))
    return _shift_add(_shift_add(x, window, -1), window, -2)


def _shift_add(x: torch.Tensor, window: torch.Tensor, dim: int) -> torch.Tensor:
    n = x.shape[dim] - len(window) + 1
    out = x.narrow(dim, 0, n) * float(window[0])
    for i in range(1, len(window)):
        out.add_(x.narrow(dim, i, n), alpha=float(window[i]))
    return out


def ssim(a: torch.Tensor, b: torch.Tensor, win_size: int = WINDOW, data_range: float = 1.0,
         gaussian: bool = False, flip_invariant: bool = False, sigma: float = GAUSSIAN_SIGMA,
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
        raise AuditError(f"ssim needs two (N, H, W) tensors of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if gaussian:
        win_size = 2 * int(GAUSSIAN_TRUNCATE * sigma + 0.5) + 1
    if win_size % 2 != 1 or win_size > min(a.shape[1:]):
        raise AuditError(f"win_size must be odd and at most the map side {min(a.shape[1:])}, got {win_size}")
    n = win_size ** 2
    cov_norm = n / (n - 1) if use_sample_covariance else 1.0
    window = _window(win_size, gaussian, sigma)
    # Blocks of maps small enough to stay in cache (the elementwise steps are memory-bound), large
    # enough to amortise the per-operation overhead; large maps go one at a time (measured best).
    pixels = a.shape[1] * a.shape[2]
    chunk = max(1, (1 << 18) // pixels) if max(a.shape[1:]) <= 64 else 1
    out = torch.cat([_ssim_block(a[i:i + chunk].double(), b[i:i + chunk].double(), window, cov_norm, data_range,
                                 flip_invariant) for i in range(0, a.shape[0], chunk)])
    return out.to(a.dtype if a.is_floating_point() else torch.float64)


def _ssim_block(x, y, window, cov_norm, data_range, flip_invariant) -> torch.Tensor:
    ux, uy, uxx, uyy, uxy = _filter(torch.stack([x, y, x * x, y * y, x * y]), window).unbind(0)
    c1, c2 = (K1 * data_range) ** 2, (K2 * data_range) ** 2
    # S = (2 ux uy + c1)(2 vxy + c2) / ((ux^2 + uy^2 + c1)(vx + vy + c2)), with the variances
    # written through a = ux uy and q = ux^2 + uy^2 to keep the number of passes low.
    a = ux * uy
    q = torch.addcmul(ux * ux, uy, uy)
    second = uxx.add_(uyy)  # uxx + uyy, reused for vx + vy

    def mean_ssim(a, q, cov_xy):
        num = (a * 2).add_(c1).mul_((cov_xy - a).mul_(2 * cov_norm).add_(c2))
        den = (q + c1).mul_((second - q).mul_(cov_norm).add_(c2))
        return num.div_(den).mean(dim=(1, 2))

    s = mean_ssim(a, q, uxy)
    if flip_invariant:
        # data_range - y has the mean data_range - uy, the same variance and the negated covariance
        # (E[x (R - y)] = R ux - E[xy]), so SSIM against the flipped map needs no further filtering.
        ux_r = ux * data_range
        a_f = ux_r - a
        q_f = q.add(uy, alpha=-2 * data_range).add_(data_range ** 2)
        second.add_(uy, alpha=-2 * data_range).add_(data_range ** 2)  # E[(R - y)^2] = R^2 - 2R uy + uyy
        s = torch.maximum(s, mean_ssim(a_f, q_f, ux_r - uxy))
    return s


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
    cell = max(2, min(maps.shape[1:]) // 4)
    return np.stack([hog(m, orientations=orientations, pixels_per_cell=(cell, cell), cells_per_block=(2, 2),
                         feature_vector=True) for m in maps.double().numpy()])


def hog_similarity(a, b) -> np.ndarray:
    """Spearman correlation of the HOG descriptors of each pair of maps -> (N,).

    a, b : (N, H, W) maps, or descriptors already computed by :func:`hog_features` (N, F).
    """
    fa = a if isinstance(a, np.ndarray) else hog_features(a)
    fb = b if isinstance(b, np.ndarray) else hog_features(b)
    return spearman(torch.from_numpy(fa), torch.from_numpy(fb))
