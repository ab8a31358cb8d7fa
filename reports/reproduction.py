"""The source papers' results beside this run's, compared like with like: each paper's conclusion per method with
where it stands and the measure it rests on, and this run's outcome under that same measure.

A paper's conclusion is data (:class:`Claim`): what it concluded, where (section, figure, or the abstract), and
the outcome each of its measures implies. A method the paper found "measure-dependent" (input x gradient and
integrated gradients under cascading randomization: the signed rank correlation drops, SSIM and the rank
correlation of magnitudes stay high) implies one outcome per measure; a visual caution (data randomization's
guided backprop, integrated gradients, input x gradient) is compared too, and marked as not a measured claim.
Each cell says, per measure, whether this run's outcome agrees, differs or is inconclusive (never counted as
differing), and a differing cell names what was measured to differ: another measure that agrees, the stage the map
stopped surviving at on a model far smaller than the paper's, and the protocol settings that differ from the
paper's. Nothing here is tuned to agree.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pandas as pd

from audit.checks import CHECKS
from audit.checks.base import INCONCLUSIVE, NOT_REJECTED, REJECTED, MedianScore, VerdictCell
from audit.checks.calibration import Calibrated
from audit.checks.convergence import input_row, median_interval
from audit.checks.data_randomization import DataRandomizationOptions
from audit.checks.randomization import CascadingOptions, Survival
from audit.checks.scale import controls_in
from audit.run.config import AuditConfig
from audit.run.protocols import PROTOCOLS, overridden
from audit.sections import Section, Table

MEASURES = {"ssim": "SSIM", "spearman_abs": "Spearman of |map|", "spearman": "signed Spearman"}
SIXT_THRESHOLD = 0.99  # Sixt et al.'s working threshold for a converged chain (section 3.1): the paper's, not the run's


@dataclass(frozen=True)
class Claim:
    """What a paper concluded about one method under one check.

    Attributes
    ----------
    method : the toolkit's name of the method
    conclusion : the paper's conclusion in words
    where : where it stands (section, figure; "abstract" for a statement of the abstract alone)
    expected : measure (a column of the check's table, :data:`MEASURES`) -> the outcome the conclusion implies
        under it
    measured : False for a visual caution (the paper's figures of maps, no measured rejection)
    """

    method: str
    conclusion: str
    where: str
    expected: dict[str, str]
    measured: bool = True


_FIG4 = "section 4, Figures 2 and 4 (Inception v3, ImageNet)"
_FIG6 = "section 5, Figures 5 and 6 (CNN, MNIST / Fashion-MNIST)"
ADEBAYO = {
    "cascading": [
        Claim("gradient", "passes: its maps change as the top layers are randomized", _FIG4,
              {"ssim": NOT_REJECTED, "spearman": NOT_REJECTED}),
        Claim("grad-cam", "passes: its maps change as the top layers are randomized", _FIG4,
              {"ssim": NOT_REJECTED, "spearman_abs": NOT_REJECTED}),
        Claim("guided-backprop", "fails: invariant to the higher layers' parameters", _FIG4,
              {"ssim": REJECTED, "spearman_abs": REJECTED}),
        Claim("guided-grad-cam", "fails: invariant to the higher layers' parameters", _FIG4,
              {"ssim": REJECTED, "spearman_abs": REJECTED}),
        Claim("input-x-gradient", "measure-dependent: the signed rank correlation drops at once, SSIM and the rank "
              "correlation of |map| stay high (visual look-alikes)", _FIG4,
              {"spearman": NOT_REJECTED, "ssim": REJECTED, "spearman_abs": REJECTED}),
        Claim("integrated-gradients", "measure-dependent: the signed rank correlation drops at once, SSIM and the "
              "rank correlation of |map| stay high (visual look-alikes)", _FIG4,
              {"spearman": NOT_REJECTED, "ssim": REJECTED, "spearman_abs": REJECTED})],
    "data-randomization": [
        Claim("gradient", "its maps change substantially", _FIG6, {"spearman_abs": NOT_REJECTED, "spearman": NOT_REJECTED}),
        Claim("smoothgrad", "its maps change substantially", _FIG6,
              {"spearman_abs": NOT_REJECTED, "spearman": NOT_REJECTED}),
        Claim("grad-cam", "its maps change substantially", _FIG6, {"spearman_abs": NOT_REJECTED}),
        Claim("guided-backprop", "a visual caution: the input's structure is still prevalent", "section 5, Figure 5",
              {"spearman_abs": REJECTED}, measured=False),
        Claim("integrated-gradients", "a visual caution: the input's structure is still prevalent, its signs change",
              "section 5, Figure 5", {"spearman_abs": REJECTED, "spearman": NOT_REJECTED}, measured=False),
        Claim("input-x-gradient", "a visual caution: the input's structure is still prevalent, its signs change",
              "section 5, Figure 5", {"spearman_abs": REJECTED, "spearman": NOT_REJECTED}, measured=False)]}

_ABSTRACT = "abstract"
_BODY = "body, not verified against the paper's text"
# Sixt, Granz & Landgraf 2020: the abstract finds "the explanations of all mentioned methods, except for DeepLIFT,
# ... independent of the parameters of later layers" for DTD, LRP, Excitation BP, PatternAttribution, DeepLIFT,
# Deconv, RectGrad and Guided BP; the rows from the body are marked as such.
SIXT = [Claim("deep-taylor", "independent of the later layers", _ABSTRACT, {"csc": REJECTED}),
        Claim("lrp-zplus", "independent of the later layers (LRP)", _ABSTRACT, {"csc": REJECTED}),
        Claim("lrp-alpha1beta0", "independent of the later layers (LRP)", _ABSTRACT, {"csc": REJECTED}),
        Claim("excitation-backprop", "independent of the later layers", _ABSTRACT, {"csc": REJECTED}),
        Claim("patternattribution", "independent of the later layers", _ABSTRACT, {"csc": REJECTED}),
        Claim("deconvnet", "independent of the later layers", _ABSTRACT, {"csc": REJECTED}),
        Claim("rectgrad", "independent of the later layers", _ABSTRACT, {"csc": REJECTED}),
        Claim("guided-backprop", "independent of the later layers", _ABSTRACT, {"csc": REJECTED}),
        Claim("deeplift", "depends on the later layers (the exception)", _ABSTRACT, {"csc": NOT_REJECTED}),
        Claim("deeplift-ablation", "converges: DeepLIFT with the intermixing removed", _BODY, {"csc": REJECTED}),
        Claim("lrp-z", "does not converge", _BODY, {"csc": NOT_REJECTED}),
        Claim("gradient", "does not converge", _BODY, {"csc": NOT_REJECTED})]


def compare(ours: str | None, expected: str) -> str:
    """"agrees", "differs" or "inconclusive" (this run could not conclude; never counted as differing)."""
    if ours in (None, "", INCONCLUSIVE):
        return INCONCLUSIVE
    return "agrees" if ours == expected else "differs"


def overall(results: list[str]) -> str:
    """A cell's result from its measures': differs when one differs, else inconclusive when one is, else agrees."""
    return "differs" if "differs" in results else INCONCLUSIVE if INCONCLUSIVE in results else "agrees"


def measure_cell(check: str, part: pd.DataFrame, measure: str, config: AuditConfig,
                 controls: pd.DataFrame | None = None) -> VerdictCell:
    """The check's verdict rule read on ``measure`` instead of its own score: the same interval, scale and curve
    rule as the verdict table's (``controls``: the model's control rows, the scale's ends), so that the two tables
    never disagree on a cell they share."""
    definition = CHECKS[check]
    rule = definition.verdict
    if not isinstance(rule, (MedianScore, Survival, Calibrated)):
        raise TypeError(f"check {check}: its verdict rule reads no metric column")
    if isinstance(rule, Calibrated) and measure != rule.metric:  # its references are measured on its own metric
        rule = next(r for r in definition.side_rules if isinstance(r, MedianScore) and r.metric == measure)
    options = definition.options_from(config.options, config.looks, config.family)
    return dataclasses.replace(rule, metric=measure).evaluate(part, options, controls=controls)


def _short(cell: VerdictCell) -> str:
    return cell.text.split(";")[0].rstrip(")") + ")" if "(" in cell.text else cell.text


def protocol_differences(check: str, config: AuditConfig) -> list[str]:
    """How this run's protocol differs from Adebayo et al.'s for ``check``: their SSIM and HOG
    (:mod:`audit.measures.measure_sets`); under cascading randomization they explained the randomized model's
    prediction and kept the BatchNorm statistics (data randomization explains the true label on both models, as
    they did)."""
    paper = PROTOCOLS["adebayo2018"].settings
    options = (CascadingOptions if check == "cascading" else DataRandomizationOptions).parse(config.options)
    out = []
    if options.measures != paper["measures"]:
        out.append("SSIM of the maps clipped at their 0.5 / 99.5 percentiles in [0, 1], flip-invariant, and HOG "
                   "by Pearson (the paper: signed maps in [-1, 1], data range 2, no flip; HOG by Spearman in its "
                   "code)")
    if not isinstance(options, CascadingOptions):
        return out
    if options.target != paper["target"]:
        out.append("explained class: the true label (the paper: the randomized model's prediction)")
    if options.bn != paper["bn"]:
        out.append("BatchNorm reset at a randomized stage (the paper: statistics kept)")
    return out


def architecture(tables: dict[str, Any], model: str) -> str:
    """The model's architecture as the run's models table names it ("" where it has none)."""
    models = tables.get("models")
    if models is None or models.empty or "arch" not in models:
        return ""
    rows = models[models.model == model]
    return str(rows.arch.iloc[0]) if not rows.empty else ""


def _reason(check: str, part: pd.DataFrame, claim: Claim, config: AuditConfig, arch: str,
            controls: pd.DataFrame | None = None) -> str:
    """What was measured to differ: other measures that give the paper's outcome, the model (its stages against
    Inception v3's blocks under cascading, its architecture against the paper's MNIST models), and the protocol
    settings that differ from the paper's."""
    reasons = []
    wanted = set(claim.expected.values())
    others = [m for m in MEASURES if m in part and m not in claim.expected]
    agree = [MEASURES[m] for m in others if len(wanted) == 1
             and measure_cell(check, part, m, config, controls).outcome in wanted]
    if agree:
        reasons.append(f"measure: {', '.join(agree)} gives the paper's outcome")
    if check == "cascading":
        stages = int(part.stage.max()) if "stage" in part else 0
        top = CascadingOptions.parse(config.options).randomization_top
        reasons.append(f"model: {stages} stages (Inception v3: 17 blocks), the verdict reads the first {top}")
    elif arch and arch not in ("cnn", "mlp"):  # the paper's own kinds of model are no difference
        reasons.append(f"model: {arch} (the paper: a CNN and an MLP on MNIST / Fashion-MNIST)")
    reasons += protocol_differences(check, config)
    return "; ".join(reasons)


def adebayo_table(tables: dict[str, Any], models: list[str], check: str, config: AuditConfig) -> pd.DataFrame:
    """Adebayo et al.'s conclusion per method under ``check`` beside this run's outcome, measure by measure, per
    model (:func:`adebayo_tables`' full table)."""
    return adebayo_tables(tables, models, check, config)[0]


def adebayo_tables(tables: dict[str, Any], models: list[str], check: str,
                   config: AuditConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Adebayo et al.'s conclusion per method under ``check`` beside this run's outcome, per model: in full (each
    measure's cell and result, and what was measured to differ) and compact (the conclusion, then per model
    agrees, inconclusive, or differs with the first differing measure and this run's outcome under it)."""
    table = tables.get(check)
    full, compact = [], []
    for claim in ADEBAYO[check]:
        if table is None or table.empty or claim.method not in set(table.method):
            continue
        row = {"method": claim.method, "Adebayo et al. 2018": f"{claim.conclusion} ({claim.where}"
               + ("; not a measured claim)" if not claim.measured else ")")}
        brief = {"method": claim.method, "Adebayo et al. 2018": claim.conclusion.split(":")[0]
                 + ("" if claim.measured else " (visual)")}
        for model in models:
            part = table[(table.model == model) & (table.method == claim.method)]
            if part.empty:
                row[model] = brief[model] = "n/a"
                continue
            results, texts, ours = {}, [], {}
            for measure, expected in claim.expected.items():
                if measure not in part:
                    results[measure] = INCONCLUSIVE
                    texts.append(f"{MEASURES[measure]} not measured")
                    continue
                cell = measure_cell(check, part, measure, config, controls_in(table, model))
                results[measure], ours[measure] = compare(cell.outcome, expected), cell.outcome
                texts.append(f"{MEASURES[measure]} {_short(cell)}, {results[measure]}")
            verdict = overall(list(results.values()))
            reason = _reason(check, part, claim, config, architecture(tables, model), controls_in(table, model)) \
                if verdict == "differs" else ""
            # a visual caution is shown beside the measurement but not counted among the agreements
            head = f"{verdict}: " if claim.measured else f"not counted, a visual caution ({verdict}): "
            row[model] = head + "; ".join(texts) + (f" [why: {reason}]" if reason else "")
            differing = [m for m, r in results.items() if r == "differs"]
            brief[model] = ("" if claim.measured else "not counted: ") \
                + (verdict if not differing else f"differs: {MEASURES[differing[0]]} {ours[differing[0]]}")
        full.append(row)
        compact.append(brief)
    return pd.DataFrame(full), pd.DataFrame(compact)


def csc_outcome(rows: pd.DataFrame) -> tuple[str | None, str]:
    """This run's CSC at the input (:func:`~audit.checks.convergence.input_row`) against Sixt et al.'s 0.99: its
    outcome (the whole 99 % interval at or above: converges; below: not; else inconclusive) and its text."""
    if rows.empty:
        return None, "n/a"
    median, low, high = (float(v[0]) for v in median_interval(rows))
    outcome = REJECTED if low >= SIXT_THRESHOLD else NOT_REJECTED if high < SIXT_THRESHOLD else INCONCLUSIVE
    return outcome, f"{median:.4f} [{low:.4f}, {high:.4f}] at {rows.layer.iloc[0]}"


def sixt_reason(csc: pd.DataFrame, model: str, method: str, arch: str) -> str:
    """What was measured where a CSC cell differs from Sixt et al.: where along the chain from the logits the
    median comes nearest 0.99 (a chain can converge above the input and spread again below), and the model."""
    chain = csc[(csc.model == model) & (csc.method == method) & csc.is_logits.astype(bool)].dropna(subset=["median"])
    reasons = []
    if not chain.empty:
        best = chain.sort_values("median").iloc[-1]
        reasons.append(f"chain: its highest median {best['median']:.4f} at {best['layer']} (depth {int(best['depth'])})")
    if arch:
        reasons.append(f"model: {arch} (the paper: VGG-16 and ResNet-50 on ImageNet)")
    return "; ".join(reasons)


def sixt_table(tables: dict[str, Any], models: list[str]) -> pd.DataFrame:
    """Sixt et al.'s conclusion per method beside this run's CSC at the input per model, against the paper's 0.99;
    a differing cell names what was measured (:func:`sixt_reason`); :func:`sixt_tables`' full table."""
    return sixt_tables(tables, models)[0]


def sixt_tables(tables: dict[str, Any], models: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sixt et al.'s conclusion per method beside this run's CSC at the input per model, in full (the median, its
    interval, the layer and why a cell differs) and compact (agrees / differs / inconclusive, and the median)."""
    csc = tables.get("csc")
    full, compact = [], []
    for claim in SIXT:
        if csc is None or csc.empty or claim.method not in set(csc.method):
            continue
        expected = claim.expected["csc"]
        side = f"CSC {'>=' if expected == REJECTED else '<'} {SIXT_THRESHOLD:g}"
        row = {"method": claim.method, "Sixt et al. 2020": f"{claim.conclusion}: {side} at the input ({claim.where})"}
        brief = {"method": claim.method, "Sixt et al. 2020": side + (" (body)" if claim.where == _BODY else "")}
        for model in models:
            rows = input_row(csc, model, claim.method)
            outcome, text = csc_outcome(rows)
            result = compare(outcome, expected) if outcome is not None else ""
            reason = sixt_reason(csc, model, claim.method, architecture(tables, model)) if result == "differs" else ""
            row[model] = text if not result else f"{result}: {text}" + (f" [why: {reason}]" if reason else "")
            brief[model] = f"{result}: {float(median_interval(rows)[0][0]):.4f}" if result else text
        full.append(row)
        compact.append(brief)
    return pd.DataFrame(full), pd.DataFrame(compact)


def protocol_note(config: AuditConfig, paper: str, differences: list[str]) -> str:
    """What protocol a table's run used and how it differs from ``paper``'s (a :data:`PROTOCOLS` name)."""
    used = PROTOCOLS[config.protocol]
    text = f"Run under the {used.name} protocol ({used.source})"
    if used.name == paper:
        bent = overridden(paper, config.options)
        text += ("; set otherwise by the run: " + ", ".join(bent)) if bent else ""
        remaining = differences + list(used.remaining)
    else:
        remaining = differences
        text += f"; --protocol {paper} follows the paper where the toolkit has an option for it"
    return text + ("; it differs from the paper in: " + "; ".join(remaining) if remaining else "") + "."


def _counts(table: pd.DataFrame, models: list[str]) -> str:
    cells = [str(v) for m in models if m in table for v in table[m]]
    counts = {r: sum(c.startswith(r) for c in cells) for r in ("agrees", "differs", INCONCLUSIVE)}
    return f"{counts['agrees']} agree, {counts['differs']} differ, {counts[INCONCLUSIVE]} inconclusive"


def reproduction_sections(verdict: pd.DataFrame, tables: dict[str, Any], config: AuditConfig) -> list[Section]:
    """The papers' comparison, for the checks the run made: a main section with each paper's compact table (the
    conclusion; per model agrees, inconclusive, or differs and by which measure) and an appendix section with the
    tables in full (each measure's median and interval, what was measured to differ, the protocol's differences)."""
    models = list(dict.fromkeys(verdict.model)) if not verdict.empty else []
    brief, full = [], []
    sixt, sixt_brief = sixt_tables(tables, models)
    if not sixt.empty:
        layers = sorted({str(layer) for m in models for claim in SIXT
                         for layer in input_row(tables.get("csc"), m, claim.method).layer})
        counts = _counts(sixt, models)
        brief.append(Table(sixt_brief, f"Sixt et al. (2020): CSC at the input against their 0.99, this run's median "
                                       f"and whether its 99 % interval lies on the paper's side ({counts}).",
                           "reproduction_sixt_brief"))
        full.append(Table(sixt, "Sixt et al. (2020), CSC at the input: the paper's conclusion (VGG-16 and ResNet-50 on "
                                "ImageNet, read at conv1_1; from the abstract or, where marked, the body) and this "
                                "run's median |cos| at the input with its 99 % interval over images, read at "
                                f"{', '.join(layers)} (the recorded layer nearest the input: on an RGB model the input "
                                "itself); agrees when the interval lies "
                                f"on the paper's side of {SIXT_THRESHOLD:g}, inconclusive when it contains it "
                                f"({counts}). A high CSC of a nonlinear backward pass (guided backprop, "
                                "deconvnet, RectGrad) is not rank-1 collapse: the verdict's mechanism reads the "
                                "spectrum. " + protocol_note(config, "sixt2020", []), "reproduction_sixt", printed=False))
    for check in ("cascading", "data-randomization"):
        if check not in tables:
            continue
        table, compact = adebayo_tables(tables, models, check, config)
        if table.empty:
            continue
        counts = _counts(table, models)
        differences = protocol_differences(check, config) if config.protocol != "adebayo2018" else []
        measure_note = ("the cascading verdict reads SSIM, the paper's ImageNet measure beside the rank correlations"
                        if check == "cascading" else "the verdict reads the Spearman of |map|: on MNIST / "
                        "Fashion-MNIST the paper compared maps by the rank correlations alone")
        brief.append(Table(compact, f"Adebayo et al. (2018), {check}: the paper's conclusion and this run's outcome "
                                    "under every measure it rests on; a differing cell names the first measure that "
                                    f"differs and this run's outcome by it ({counts}; visual cautions not counted).",
                           f"reproduction_adebayo_{check}_brief"))
        full.append(Table(table, f"Adebayo et al. (2018), {check}: the paper's conclusion per method (where it "
                                 "stands, and whether it is a measured claim) and this run's outcome under each "
                                 "measure the conclusion rests on, per model; each measure agrees, differs or is "
                                 "inconclusive, a differing cell names what was measured to differ "
                                 f"({counts}). {measure_note.capitalize()}. "
                                 + protocol_note(config, "adebayo2018", differences),
                          f"reproduction_adebayo_{check}", printed=False))
    if not brief:
        return []
    return [Section("The source papers, reproduced", "What Sixt et al. (2020) and Adebayo et al. (2018) concluded, "
                    "each beside this run's measurement by the same measure on its models. The rules are not tuned "
                    "to agree: a model that differs from a paper is shown as differing. Each cell in full, with what "
                    "was measured to differ and how this run's protocol differs from the paper's: the appendix.",
                    tables=brief),
            Section("The source papers in full", tables=full, appendix=True)]
