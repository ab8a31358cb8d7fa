"""Similarity of attribution maps: heatmap reduction, normalisation, batched SSIM, rank correlations.

``ssim`` is scikit-image's ``structural_similarity`` (2-D, one channel) computed for a batch of
maps at once in torch: the same windows, constants and cropping, so the two agree to float64
rounding. Only windows lying fully inside the image enter the mean (scikit-image crops the
filter radius), so no padding is needed.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

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

    Parameters
    ----------
    maps : Tensor
        (N, C, H, W) attribution maps.
    mode : str
        ``"sum"`` or ``"max-abs"`` (:data:`REDUCTIONS`).

    Returns
    -------
    Tensor
        (N, H, W) heatmaps, in the maps' dtype.

    Raises
    ------
    ConfigError
        For another ``mode``.
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
    flat = maps.reshape(maps.shape[0], -1)
    if bool(torch.isfinite(flat).all()):  # the usual case: one pass to find the constant maps, no copy
        low, high = torch.aminmax(flat, dim=1)
        return (low == high).numpy(), maps
    return degenerate(maps), torch.nan_to_num(maps, 0.0, 0.0, 0.0)


def undefined_where(bad: np.ndarray, scores: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``scores`` (each (N,)) with NaN for the images marked ``bad``."""
    return {k: np.where(bad, np.nan, np.asarray(v, dtype=float)) for k, v in scores.items()}


def normalize_map(maps: torch.Tensor, low: float = 0.5, high: float = 99.5) -> torch.Tensor:
    """Clip each (H, W) map of (N, H, W) at its ``low`` / ``high`` percentiles, then min-max to [0, 1].

    The percentiles are ``torch.quantile``'s (linear interpolation). A constant map becomes all zeros.

    Parameters
    ----------
    maps : Tensor
        (N, H, W) maps (any (N, ...) shape: each map is normalised over all its entries).
    low : float, default 0.5
        The lower clipping percentile, in [0, 100].
    high : float, default 99.5
        The upper clipping percentile, in [0, 100].

    Returns
    -------
    Tensor
        Shaped like ``maps``, in their dtype, values in [0, 1] (computed in float64).
    """
    flat = maps.reshape(maps.shape[0], -1).double()
    return normalized_from_sorted(flat, flat.sort(1).values, low, high).reshape(maps.shape).to(maps.dtype)


def by_largest_magnitude(maps: torch.Tensor) -> torch.Tensor:
    """Each (H, W) map of (N, H, W) divided by its largest magnitude -> values in [-1, 1], float64 (a map of
    zeros stays zeros): the [-1, 1] scaling of Adebayo et al.'s (2018) SSIM."""
    x = maps.double()
    top = x.abs().amax(dim=tuple(range(1, x.ndim)), keepdim=True)
    return torch.where(top > 0, x / torch.where(top > 0, top, 1.0), torch.zeros_like(x))


def normalized_from_sorted(flat: torch.Tensor, ordered: torch.Tensor, low: float = 0.5, high: float = 99.5) -> torch.Tensor:
    """:func:`normalize_map` of rows (N, P) whose sorted values ``ordered`` (N, P) are at hand."""
    # torch.quantile's interpolation, on values already sorted (they come with the ranks)
    position = torch.tensor([low / 100, high / 100], dtype=torch.float64) * (flat.shape[1] - 1)
    below, above = position.long(), position.ceil().long()
    q = ordered[:, below].lerp(ordered[:, above], (position - below).to(ordered.dtype))
    lo, hi = q[:, :1], q[:, 1:]  # the percentiles: the clipped map's extremes
    clipped = flat.clamp(min=lo, max=hi)
    span = hi - lo
    return torch.where(span > 0, (clipped - lo) / torch.where(span > 0, span, 1.0), torch.zeros_like(clipped))


def _window(win_size: int, gaussian: bool, sigma: float) -> torch.Tensor:
    """1-D window weights: a uniform box, or scikit-image's Gaussian (truncate 3.5, normalised)."""
    if not gaussian:
        return torch.full((win_size,), 1.0 / win_size, dtype=torch.float64)
    radius = int(GAUSSIAN_TRUNCATE * sigma + 0.5)
    k = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=torch.float64) / sigma) ** 2)
    return k / k.sum()


def _band(n: int, window: torch.Tensor) -> torch.Tensor:
    """(n, n - len + 1) matrix whose columns are the window at each valid offset."""
    return _band_of(n, tuple(window.tolist())).to(window.dtype)


@functools.lru_cache(maxsize=32)
def _band_of(n: int, window: tuple[float, ...]) -> torch.Tensor:
    k, taps = len(window), torch.tensor(window, dtype=torch.float64)
    band = torch.zeros(n, n - k + 1, dtype=torch.float64)
    for j in range(n - k + 1):
        band[j:j + k, j] = taps
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


def ssim(a: torch.Tensor, b: torch.Tensor, win_size: int = WINDOW, data_range: float = 1.0, *,
         gaussian: bool = False, flip_invariant: bool | torch.Tensor = False, sigma: float = GAUSSIAN_SIGMA,
         use_sample_covariance: bool = True, a_means: torch.Tensor | None = None) -> torch.Tensor:
    """Mean structural similarity of each pair of maps.

    Parameters
    ----------
    a, b : (N, H, W) tensors
    win_size : odd window side (ignored with ``gaussian``, whose window is 2 * int(3.5 sigma + 0.5) + 1)
    data_range : the maps' value range (1 for normalised maps)
    gaussian : Gaussian-weighted windows (sigma 1.5) instead of a uniform box
    sigma : the Gaussian window's standard deviation (with ``gaussian``)
    flip_invariant : the larger of SSIM(a, b) and SSIM(a, data_range - b): for maps normalised to
        [0, data_range] with symmetric percentile clipping, data_range - b is the normalised -b; a (N,) bool
        tensor takes the larger only for the pairs it marks (:func:`sign_flip_allowed`)
    use_sample_covariance : divide covariances by NP - 1 (scikit-image's default)
    a_means : :func:`local_means` of ``a`` with the same window, when at hand (a reference compared
        with many sets is filtered once)

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
    side = (a.shape[1] - len(window) + 1, a.shape[2] - len(window) + 1)
    if a_means is not None and a_means.shape != (2, len(a), *side):
        raise AuditError(f"a_means must be local_means(a) with this window, of shape {(2, len(a), *side)}, got "
                         f"{tuple(a_means.shape)}")
    # Blocks of maps small enough to stay in cache (the elementwise steps are memory-bound), large
    # enough to amortise the per-operation overhead; large maps go one at a time (measured best).
    pixels = a.shape[1] * a.shape[2]
    chunk = max(1, (1 << 18) // pixels) if max(a.shape[1:]) <= 64 else 1
    flips = flip_invariant if isinstance(flip_invariant, torch.Tensor) else \
        torch.full((a.shape[0],), bool(flip_invariant))
    if flips.shape != (a.shape[0],):
        raise AuditError(f"flip_invariant must be a bool or one bool per pair ({a.shape[0]}), got shape "
                         f"{tuple(flips.shape)}")
    out = torch.cat([_ssim_block(a[i:i + chunk].double(), b[i:i + chunk].double(), window, cov_norm, data_range,
                                 flips[i:i + chunk], None if a_means is None else a_means[:, i:i + chunk])
                     for i in range(0, a.shape[0], chunk)])
    return out.to(a.dtype if a.is_floating_point() else torch.float64)


def local_means(a: torch.Tensor, win_size: int = WINDOW, gaussian: bool = False,
                sigma: float = GAUSSIAN_SIGMA) -> torch.Tensor:
    """The local means of (N, H, W) maps and of their squares over :func:`ssim`'s valid windows ->
    (2, N, H - w + 1, W - w + 1) float64, w the window side (``win_size``; with ``gaussian``, set by sigma)."""
    x = a.double()
    return _filter(torch.stack([x, x * x]), _window(win_size, gaussian, sigma))


def _ssim_block(x: torch.Tensor, y: torch.Tensor, window: Any, cov_norm: float, data_range: float,
                flip_invariant: torch.Tensor, x_means: Any = None) -> torch.Tensor:
    if x_means is None:
        ux, uy, uxx, uyy, uxy = _filter(torch.stack([x, y, x * x, y * y, x * y]), window).unbind(0)
    else:
        (ux, uxx), (uy, uyy, uxy) = x_means.double().unbind(0), _filter(torch.stack([y, y * y, x * y]), window).unbind(0)
    c1, c2 = (K1 * data_range) ** 2, (K2 * data_range) ** 2
    # S = (2 ux uy + c1)(2 vxy + c2) / ((ux^2 + uy^2 + c1)(vx + vy + c2)), with the variances
    # written through a = ux uy and q = ux^2 + uy^2 to keep the number of passes low.
    a = ux * uy
    q = torch.addcmul(ux * ux, uy, uy)
    second = uyy.add_(uxx)  # uxx + uyy, reused for vx + vy (uxx may be the caller's)

    def mean_ssim(a: torch.Tensor, q: torch.Tensor, cov_xy: torch.Tensor) -> torch.Tensor:
        num = (a * 2).add_(c1).mul_((cov_xy - a).mul_(2 * cov_norm).add_(c2))
        den = (q + c1).mul_((second - q).mul_(cov_norm).add_(c2))
        return num.div_(den).mean(dim=(1, 2))

    s = mean_ssim(a, q, uxy)
    if bool(flip_invariant.any()):
        # data_range - y has the mean data_range - uy, the same variance and the negated covariance
        # (E[x (R - y)] = R ux - E[xy]), so SSIM against the flipped map needs no further filtering.
        ux_r = ux * data_range
        a_f = ux_r - a
        q_f = q.add(uy, alpha=-2 * data_range).add_(data_range ** 2)
        second.add_(uy, alpha=-2 * data_range).add_(data_range ** 2)  # E[(R - y)^2] = R^2 - 2R uy + uyy
        s = torch.where(flip_invariant, torch.maximum(s, mean_ssim(a_f, q_f, ux_r - uxy)), s)
    return s


def map_signs(maps: torch.Tensor | np.ndarray) -> np.ndarray:
    """The sign of each map of (N, ...): 1 where no value is negative, -1 where none is positive, 0 where both
    occur -> (N,) int8 (an all-zero map counts as 1)."""
    flat = np.asarray(maps).reshape(len(maps), -1)
    return np.where((flat >= 0).all(1), 1, np.where((flat <= 0).all(1), -1, 0)).astype(np.int8)


def sign_flip_allowed(a: np.ndarray, b: np.ndarray) -> torch.Tensor:
    """Which pairs of maps the flip-invariant SSIM may compare with the sign-flipped second map, from their
    :func:`map_signs` (N,) -> (N,) bool tensor: every pair but two maps of one sign. A sign flip is what a rank-1
    chain does to a map (Sixt et al. 2020); two non-negative maps (a max-abs reduction's) have no sign to flip,
    and comparing one with the other's contrast inversion would only inflate the score."""
    return torch.from_numpy(~((a == b) & (a != 0)))


def _sorted_ranks(ordered: np.ndarray) -> np.ndarray:
    """Average ranks (1 to P) of the values of (N, P) rows sorted along them -> (N, P) float64: each value's
    position, a tie run's values the mean of their positions. NaN (sorted last) ties with nothing."""
    n, p = ordered.shape
    out = np.tile(np.arange(1, p + 1, dtype=np.float64), (n, 1))
    # the values equal to their predecessor: few in a map, so the runs are mended where they are, not rebuilt
    repeat = np.flatnonzero(ordered[:, 1:] == ordered[:, :-1])
    if repeat.size:
        row, col = np.divmod(repeat, p - 1)
        at = row * p + col + 1  # flat positions in (N, P); a run never spans two rows (column 0 repeats nothing)
        opens = np.ones(len(at), dtype=bool)
        np.not_equal(at[1:] - at[:-1], 1, out=opens[1:])
        run = np.cumsum(opens) - 1
        first = at[opens] - 1  # each run's first value
        mean = first % p + (np.bincount(run) + 2) / 2  # 0-based first position + (length + 1) / 2, length = repeats + 1
        flat = out.reshape(-1)
        flat[first] = mean
        flat[at] = mean[run]
    return out


def _ranked(values: np.ndarray, order: np.ndarray | None, unit: bool, ordered: np.ndarray | None = None
            ) -> np.ndarray:
    """:func:`ranks` of (N, P) ``values`` (``order``: their argsort along rows, ``ordered`` the values sorted
    along rows, if at hand), or with ``unit`` :func:`unit_ranks`' centred unit-length vectors: computed in sorted
    order, then put in place once."""
    n, p = values.shape
    order = np.argsort(values, axis=1) if order is None else order
    ordered = np.take_along_axis(values, order, 1) if ordered is None else ordered
    r = _sorted_ranks(ordered)
    if unit:
        r -= (p + 1) / 2  # the mean rank
        norm = np.sqrt(np.einsum("ij,ij->i", r, r))
        norm[np.isnan(ordered[:, -1])] = 0.0  # NaN has no rank (argsort puts it last): the row's correlations are NaN
        with np.errstate(invalid="ignore", divide="ignore"):
            r /= norm[:, None]
        r[~(norm > 0)] = np.nan
    out = np.empty((n, p))
    np.put_along_axis(out, order, r, 1)
    return out


def ranks(values: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Average ranks (1 to P; tied values share their mean rank, as ``scipy.stats.rankdata``) along
    each row of (N, P) values -> (N, P) float64. ``order``: ``np.argsort(values, 1)`` if at hand."""
    return _ranked(values, order, unit=False)


def unit_ranks(values: Any, order: np.ndarray | None = None, ordered: np.ndarray | None = None) -> np.ndarray:
    """The average ranks of each flattened row of (N, ...) values, centred and scaled to unit length
    -> (N, P); NaN rows for constant rows and rows holding NaN. The Spearman correlation of two rows is the dot product of
    theirs, so a set of maps compared many times is ranked once. ``order``: ``np.argsort`` of the (N, P) rows and
    ``ordered`` the rows sorted, if at hand."""
    values = values.reshape(values.shape[0], -1)
    flat = values.double().numpy() if isinstance(values, torch.Tensor) else np.asarray(values, dtype=np.float64)
    return _ranked(flat, order, unit=True, ordered=ordered)


def unit_centred(values: Any) -> np.ndarray:
    """Each flattened row of (N, ...) values centred and scaled to unit length -> (N, P) float64; NaN rows for
    constant rows and rows holding NaN. The Pearson correlation of two rows is the dot product of theirs."""
    flat = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    centred = flat - flat.mean(1, keepdims=True)
    norm = np.sqrt(np.einsum("ij,ij->i", centred, centred))[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((norm > 0) & np.isfinite(norm), centred / norm, np.nan)


def correlation(ra: np.ndarray, rb: np.ndarray) -> np.ndarray:
    """Row-wise dot products of two (N, P) :func:`unit_ranks` (Spearman) or :func:`unit_centred` (Pearson)
    -> (N,) correlations (NaN where either row was constant). ``ra`` may have one row for every
    ``len(rb) // len(ra)`` rows of ``rb`` (a reference set against several stacked sets)."""
    if len(rb) != len(ra):
        ra = np.tile(ra, (len(rb) // len(ra), 1))
    result: np.ndarray = np.einsum("ij,ij->i", ra, rb)
    return result


def spearman(a: Any, b: Any) -> np.ndarray:
    """Spearman rank correlation of each pair of flattened maps (N, ...) -> (N,) (average ranks for
    ties, as scipy; NaN where either map is constant).

    Parameters
    ----------
    a, b : Tensor or numpy.ndarray
        (N, ...) maps, each flattened; pairs are ``a[i]``, ``b[i]``.

    Returns
    -------
    numpy.ndarray
        (N,) float64 correlations; NaN where either map is constant or holds NaN.
    """
    return correlation(unit_ranks(a), unit_ranks(b))


def _orientation_bins(angle: torch.Tensor, orientations: int) -> torch.Tensor:
    """(N, H, W) int64 orientation bin of each pixel's (N, H, W) float64 angle in [0, 180] degrees; ``orientations``
    for an angle that votes in no bin."""
    step = 180.0 / orientations
    # a pixel votes in bin i when edge i <= angle < edge i + 1, edge i = step * i as scikit-image computes it
    # (the products below, in double precision, are those edges exactly); an angle rounded up to 180 votes
    # nowhere (bin ``orientations``, dropped). The quotient's bin moved by one where rounding put it on
    # the wrong side of an edge.
    bins = (angle / step).floor_().clamp_(0, orientations)
    bins -= (angle < bins * step).to(angle.dtype)
    bins += (angle >= (bins + 1) * step).to(angle.dtype)
    return bins.long()


def _l2_hys_blocks(hist: torch.Tensor) -> torch.Tensor:
    """(N, rows - 1, cols - 1, 4 orientations) overlapping 2 x 2 blocks of (N, rows, cols, orientations) cell
    histograms, each normalised by L2-Hys (eps 1e-5, clipped at 0.2)."""
    n, rows, cols, orientations = hist.shape
    blocks = torch.stack([hist[:, r:r + rows - 1, c:c + cols - 1] for r in (0, 1) for c in (0, 1)], 3)
    blocks = blocks.reshape(n, rows - 1, cols - 1, 2 * 2 * orientations)  # (block row, block col, cell, bin)
    eps2 = 1e-5 ** 2
    blocks = blocks / torch.sqrt((blocks * blocks).sum(-1, keepdim=True) + eps2)
    blocks = blocks.clamp(max=0.2)
    return blocks / torch.sqrt((blocks * blocks).sum(-1, keepdim=True) + eps2)


def hog_features(maps: torch.Tensor, orientations: int = 9) -> np.ndarray:
    """HOG descriptors of (N, H, W) maps -> (N, F): scikit-image's ``hog`` (cells of about a quarter of
    the side, 2 x 2 blocks, L2-Hys) for all maps at once.

    As scikit-image: central differences (zero on the border), unsigned orientations in [0, 180)
    degrees in equal bins, each cell's magnitudes per bin summed in single precision and divided by
    the cell's area, blocks normalised by L2-Hys (eps 1e-5, clipped at 0.2). Agrees with it to
    single-precision rounding of the cell sums (scikit-image adds pixel by pixel into a float).

    Parameters
    ----------
    maps : Tensor
        (N, H, W) maps (computed in float64). The cell side is ``max(2, min(H, W) // 4)``; the maps
        must hold at least 2 x 2 cells.
    orientations : int, default 9
        Orientation bins over [0, 180) degrees.

    Returns
    -------
    numpy.ndarray
        (N, F) float64 descriptors, F = (rows - 1) (cols - 1) 4 ``orientations`` for rows x cols cells.

    Raises
    ------
    AuditError
        When the maps are too small for 2 x 2 cells.
    """
    x = maps.double()
    n, h, w = x.shape
    cell = max(2, min(h, w) // 4)
    rows, cols = h // cell, w // cell
    if rows < 2 or cols < 2:
        raise AuditError(f"HOG needs maps of at least {2 * cell} x {2 * cell}, got {h} x {w}")
    g_row, g_col = torch.zeros_like(x), torch.zeros_like(x)
    torch.sub(x[:, 2:], x[:, :-2], out=g_row[:, 1:-1])
    torch.sub(x[:, :, 2:], x[:, :, :-2], out=g_col[:, :, 1:-1])
    g_row, g_col = g_row[:, :rows * cell, :cols * cell].contiguous(), g_col[:, :rows * cell, :cols * cell].contiguous()
    magnitude = torch.hypot(g_col, g_row)
    angle = torch.rad2deg(torch.atan2(g_row, g_col)).remainder_(180)
    bins = _orientation_bins(angle, orientations)
    cell_of = (torch.arange(rows * cell) // cell)[:, None] * cols + (torch.arange(cols * cell) // cell)[None]
    index = (cell_of[None] * (orientations + 1) + bins).reshape(n, -1)
    sums = torch.zeros(n, rows * cols * (orientations + 1), dtype=x.dtype)
    sums.scatter_add_(1, index, magnitude.reshape(n, -1))
    hist = (sums.float() / (cell * cell)).double().reshape(n, rows, cols, orientations + 1)[..., :orientations]
    return _l2_hys_blocks(hist).reshape(n, -1).numpy()


def hog_similarity(a: Any, b: Any) -> np.ndarray:
    """Pearson correlation of the HOG descriptors of each pair of maps -> (N,), Adebayo et al.'s (2018)
    HOG measure.

    Parameters
    ----------
    a, b : Tensor or numpy.ndarray
        (N, H, W) maps as a tensor, or descriptors already computed by :func:`hog_features`, (N, F): a
        numpy array is taken as descriptors, whatever its shape.

    Returns
    -------
    numpy.ndarray
        (N,) Pearson correlations of the descriptors (NaN where either is constant).
    """
    fa = a if isinstance(a, np.ndarray) else hog_features(a)
    fb = b if isinstance(b, np.ndarray) else hog_features(b)
    return correlation(unit_centred(fa), unit_centred(fb))
