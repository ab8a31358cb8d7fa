"""Smooth model parameter randomization test, sMPRT (Hedstroem et al. 2023, "Sanity Checks
Revisited").

Gradient-like maps are noisy, and noise alone lowers the similarity between the trained model's
map and a randomized model's map, flattering a method. sMPRT denoises first: each map is the mean
of the method's maps over N noisy copies of the input (Gaussian, standard deviation ``noise`` times
the image's value range, the last copy noise-free), before and after each randomization stage
(bottom-up by default); maps are compared by the Spearman rank correlation of their magnitudes
(normalising by the second moment, as Quantus does, does not change ranks). The noise is drawn
once per image (seeded) and reused at every stage, so stages differ only by their weights. Lower
similarity after full randomization is better.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from attributions.explainer import Explainer, attribute_many
from attributions.hygiene import leaves_process_alone
from attributions.shared_pass import SharedPass
from audit.checks.base import Check, UnitResult
from audit.checks.calibration import NearerThanUnrelated
from audit.checks.coverage import paragraph as coverage_paragraph
from audit.checks.coverage import recorded_in
from audit.checks.options import UnitContext, option
from audit.checks.passes import Params
from audit.checks.randomization import stage_figure, stage_maps
from audit.checks.replicates import joined, per_seed
from audit.checks.stage_options import ORDERS, StageOptions, StageSettings, stage_settings
from audit.errors import ConfigError
from audit.inputs import Images, Labels, Methods, Reduction, check_inputs
from audit.measures.similarity import correlation, screen, unit_ranks
from audit.sections import ReportContext, Section

COLUMNS = ["method", "stage", "layer", "image", "replicate", "spearman", "unrelated_spearman", "share"]
CHUNK = 256  # images per attribution call: noisy copies are explained in batches of this size


def noisy_copies(x: torch.Tensor, n_samples: int, noise: float, seed: int) -> torch.Tensor:
    """N copies of each image with Gaussian noise of standard deviation ``noise`` x (max - min) of
    that image, the last copy noise-free: (B, ...) -> (N, B, ...). Seeded; the global RNG is untouched."""
    if n_samples < 1 or noise < 0:
        raise ConfigError(f"sMPRT needs n_samples >= 1 and noise >= 0, got {n_samples} and {noise}")
    flat = x.reshape(x.shape[0], -1)
    scale = (flat.max(1).values - flat.min(1).values).reshape(-1, *([1] * (x.ndim - 1)))
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn((n_samples, *x.shape), generator=gen, dtype=x.dtype).to(x.device) * (noise * scale)
    eps[-1] = 0.0
    return x[None] + eps


@leaves_process_alone
def smooth_mprt(model: torch.nn.Module, x: Images, y: Labels, methods: Methods = "all", *, n_samples: int = 50,
                noise: float = 0.1, stages: StageSettings | None = None, reduction: Reduction | None = None,
                progress: bool = True, params: Params | None = None, **settings: Any) -> pd.DataFrame:
    """sMPRT: Spearman correlation of denoised maps' magnitudes before and after each randomization stage.

    Parameters
    ----------
    model : nn.Module; never modified (stages are copies)
    x : (B, C, H, W) images
    y : (B,) labels
    methods : names, "all" or a comma-separated string
    n_samples : noisy copies averaged per map (the last one noise-free); 1 is the plain MPRT
    noise : standard deviation of the noise, as a fraction of each image's value range
    stages : the :class:`~audit.checks.stage_options.StageSettings` (bottom-up by default, as Hedstroem et al.;
        its seed seeds the noise too), or any of its fields as keywords (order, bn, init, granularity, target,
        seed)
    reduction : {method: "sum" | "max-abs"} overrides of the heatmap reduction
    progress : whether to show progress bars
    params : {method: {name: value}}, parameters given to each method's explainer (an audit's pattern methods'
        patterns and their data), optional
    **settings : any field of the stage settings by keyword, in place of ``stages``

    Returns
    -------
    DataFrame, one row per method x stage x image: method, stage (0 = trained), layer, image, replicate (of the
    image's re-initialisation seed: :mod:`audit.checks.replicates`), spearman (of ``|denoised map|`` with the
    trained model's; 1 at stage 0), unrelated_spearman (the trained map's against the stage's map of another image
    drawn with the same seed, the next one: the floor of an unrelated map; NaN for a seed with one image), share (of
    the parameters re-initialised in that stage's model).
    """
    stages = stage_settings(stages, settings, order="bottom-up")
    x, y = check_inputs(model, x, y)
    return joined(per_seed(model, x, y, stages, "smooth_mprt",
                           lambda p: _one_seed(model, p.x, p.y, methods, p.stages, n_samples, noise, reduction,
                                               progress, params=params)),
                  COLUMNS)


def _one_seed(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, methods: Methods, stages: StageSettings,
              n_samples: int, noise: float, reduction: Reduction | None, progress: bool, *,
              params: Params | None) -> pd.DataFrame:
    """:func:`smooth_mprt` of images drawn with one seed, ``stages.seed`` (the noise's too), without the
    ``replicate`` column."""
    copies = noisy_copies(x, n_samples, noise, stages.seed)
    batch = copies.reshape(-1, *x.shape[1:])

    def denoised(explainers: dict[str, Explainer], x: torch.Tensor, t: torch.Tensor,
                 shared: SharedPass | None) -> dict[str, torch.Tensor]:
        # the stage's shared forward pass is for x alone: the noisy copies get their own, in chunks
        tt = t.repeat(n_samples)
        total: dict[str, torch.Tensor] = {}
        for start in range(0, len(batch), CHUNK):
            part = attribute_many(explainers, batch[start:start + CHUNK], [tt[start:start + CHUNK]])
            for m, v in part.items():
                total[m] = torch.cat([total[m], v[0]]) if m in total else v[0]
        return {m: v.reshape(n_samples, *x.shape).mean(0) for m, v in total.items()}

    rows: list[dict[str, Any]] = []
    first: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # the trained model's maps, ranked once
    for stage in stage_maps(model, x, y, methods, stages, reduction=reduction, progress=progress, name="smooth_mprt",
                            explain=denoised, params=params):
        for m, v in stage.maps.items():
            bad, clean = screen(v.abs())
            ranked = unit_ranks(clean)
            bad_ref, ref_ranks = first.setdefault(m, (bad, ranked))
            rho = np.where(bad_ref | bad, np.nan, correlation(ref_ranks, ranked))
            # the floor: the same comparison with another image's map at this stage (the next image of the seed's)
            other = np.roll(np.arange(len(rho)), -1)
            unrelated = np.where(bad_ref | bad[other], np.nan, correlation(ref_ranks, ranked[other])) \
                if len(rho) > 1 else np.full(len(rho), np.nan)
            rows += [{"method": m, "stage": stage.stage, "layer": stage.layer, "image": i, "spearman": float(rho[i]),
                      "unrelated_spearman": float(unrelated[i]), "share": stage.share} for i in range(len(rho))]
    return pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "replicate"])


@dataclass(frozen=True)
class SmprtOptions(StageOptions):
    """sMPRT's keys: the stage keys, its order and noise."""

    smprt_order: str = option("bottom-up", "layer order of sMPRT's randomization", choices=ORDERS)
    smprt_samples: int = option(50, "noisy copies averaged per sMPRT map (the last noise-free)",
                                valid=lambda v: v >= 1, rule=">= 1")
    smprt_noise: float = option(0.1, "sMPRT noise, standard deviation as a fraction of the image's range",
                                valid=lambda v: v >= 0, rule=">= 0")


def _run(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, options: SmprtOptions,
         unit: UnitContext) -> UnitResult:
    return UnitResult(smooth_mprt(model, x, y, [method], n_samples=options.smprt_samples, noise=options.smprt_noise,
                                  stages=options.stages(options.smprt_order, unit.seed, unit.first_image),
                                  progress=unit.progress, params=unit.params))


def _sections(table: pd.DataFrame, context: ReportContext, options: SmprtOptions) -> list[Section]:
    figures = [stage_figure(table, m, "spearman", "Spearman of |denoised map|", f"smprt_{m}",
                            f"sMPRT on {m}: Spearman correlation of each denoised map's magnitude with the trained "
                            "model's as layers are randomized", ylim=(-0.05, 1.05))
               for m in table.model.unique()]
    return [Section("Smooth MPRT (sMPRT)", text="Maps averaged over noisy inputs before comparison, so that noise "
                    "alone does not lower the similarity. Lower after full randomization is better. "
                    + coverage_paragraph(context.run, "smprt_coverage.csv", list(table.model.unique())),
                    figures=figures)]


def _last_stage(df: pd.DataFrame) -> pd.DataFrame:
    last: pd.DataFrame = df[df.stage == df.stage.max()]
    return last


CHECK = Check(
    coverage=recorded_in(lambda options: options.smprt_order), options=SmprtOptions,
    name="smprt", cite=("hedstrom2024",), title="Smooth MPRT (sMPRT)", reference="Hedstroem et al. 2023", result_file="smprt.csv",
    columns=COLUMNS, run=_run, sections=_sections, order=41,
    summary=lambda df: f"median Spearman at full randomization {_last_stage(df).spearman.median():.3f}",
    verdict=NearerThanUnrelated("smprt_spearman", "smprt", "weight-insensitive (denoised)",
                                score_name="Spearman of magnitudes (sMPRT)", metric="spearman", select=_last_stage),
    question="Does the denoised map change as the weights are randomized?",
    description="maps averaged over noisy inputs, compared by Spearman of magnitudes after each randomization stage",
    controls={"edge": "rejected"})
