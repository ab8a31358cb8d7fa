"""The report's methods text: paragraphs a paper can paste, from what the run recorded.

The text is written once, with citations as ``[@key]`` / ``[@a; @b]`` (keys of
:mod:`reports.references`); :func:`markdown` turns them into author-year text and :func:`latex`
into ``\\citep{...}`` (natbib), escaping the rest.
"""
from __future__ import annotations

import re
from typing import Any

import pandas as pd

from attributions.methods import BUILDERS, build_method
from audit import style
from audit.checks import CHECKS
from audit.checks.options import look_level
from audit.run.config import family_of, looks_of
from reports.latex import escape
from reports.references import REFERENCES, plain, short
from reports.verdict import family_bound

CITATION = re.compile(r"\[@([^\]]+)\]")
DATA = {"fashion-mnist": ("Fashion-MNIST test images [@xiao2017]", ""),
        "embedded": ("Fashion-MNIST test images [@xiao2017]", " from the sample shipped with the toolkit")}


def _cite(keys: tuple[str, ...] | list[str]) -> str:
    return f"[@{'; @'.join(keys)}]" if keys else ""


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _value(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _twin_sentence(manifest: dict[str, Any], test: str) -> str:
    """Which twin each model was compared with, how it was trained and how well it fits its permuted labels; and
    the models skipped for want of a twin."""
    parts = []
    for model, record in manifest.get("twins", {}).items():
        for twin in record.get("pairs", [record]):  # a run of one pair recorded it alone
            accuracy = twin.get("train_accuracy")
            test_accuracy = twin.get("test_accuracy")
            parts.append(f"{model} with {twin['spec']} (labels of {twin.get('train_size', '?')} training images "
                         f"permuted with seed {twin.get('label_seed', '?')}; training accuracy "
                         f"{'?' if accuracy is None else f'{accuracy:.3f}'} on them, test accuracy "
                         f"{'?' if test_accuracy is None else f'{test_accuracy:.3f}'} on the true labels)")
    text = f" Twins: {'; '.join(parts)}." if parts else ""
    skipped = manifest.get("skipped", {}).get(test, {})
    return text + (f" Not tested for want of a twin: {', '.join(skipped)}." if skipped else "")


def _coverage_sentence(covered: dict[str, dict[str, Any]]) -> str:
    """What a randomization check's stages re-initialised, per model, from the manifest's coverage."""
    parts = []
    for model, c in covered.items():
        extra = [f"{len(c['constant_default'])} of its {c['tensors']} tensors reset to a constant untrained default "
                 "(normalisation weights 1, biases 0)"] if c["constant_default"] else []
        if c["kept_trained"]:
            extra.append(f"{len(c['kept_trained'])} BatchNorm tensors kept trained")
        parts.append(f"{model}: {c['stages']} {c['granularity']} stages re-initialising "
                     f"{100 * c['share_reinitialised']:.1f} % of the parameters" + (f" ({'; '.join(extra)})" if extra else ""))
    return ("Every parameter tensor belongs to one stage (the re-initialised tensors and how each was drawn are in "
            f"the run's coverage files): {'; '.join(parts)}.")


def _pattern_data(manifest: dict[str, Any]) -> str:
    """What the pattern methods' patterns were fitted on, as the manifest records it."""
    record = manifest.get("patterns")
    return "the images each check explains" if not record else \
        f"{record['data']} (each trained model's patterns fitted once, kept beside its checkpoint and reused)"


def _models_paragraph(models: pd.DataFrame) -> tuple[str, bool]:
    """The models paragraph's text, and whether any model is Bort-trained."""
    rows = []
    for row in models.itertuples(index=False):
        accuracy = getattr(row, "test_accuracy", float("nan"))
        facts = [f"architecture {row.arch}"]
        if str(row.optimizer) not in ("unknown", "", "nan", "None"):  # a library's or the user's own model: unsaid
            facts.append(f"trained with {row.optimizer}")
        if accuracy == accuracy:
            facts.append(f"test accuracy {100 * float(accuracy):.2f} %")
        rows.append(f"{row.model} ({', '.join(facts)})")
    bort = any("bort" in str(o) for o in getattr(models, "optimizer", []))
    text = (f"We audited {len(rows)} model{'s' * (len(rows) != 1)}: {_join(rows) if rows else 'none'}."
            + (" Bort-trained models are optimised under the bounded orthogonality constraint of "
               f"{_cite(['zhang2023bort'])}." if bort else ""))
    return text, bort


def _data_paragraph(manifest: dict[str, Any], config: dict[str, Any]) -> str:
    """The data paragraph: which images, how they were drawn and preprocessed."""
    images = manifest.get("images", {})
    n = images.get("n", config["n_images"])
    if config["data"] == "imagefolder":
        steps = images.get("preprocess", {})
        how = "; ".join(filter(None, [f"shorter side resized to {steps['resize']} px" if "resize" in steps else "",
                                      f"centre crop of {steps['crop']} px" if "crop" in steps else "",
                                      f"normalised with mean {steps['mean']} and std {steps['std']}"
                                      if "mean" in steps else ""])) or "pixel values scaled to [0, 1]"
        data = (f"{n} images from {len(images.get('classes', []))} classes of the image folder "
                f"{images.get('root', config.get('data_root'))}, drawn stratified by class with seed {config['seed']} "
                f"(the files are listed in the run's manifest); preprocessing: {how}.")
    else:
        source, where = DATA.get(config["data"], (f"images from {config['data']}", ""))
        data = f"{n} {source}{where}, drawn class-balanced (the first images of each class)."
    return data + " Every method explains each image's true class unless a check says otherwise."


def _method_entry(manifest: dict[str, Any], name: str) -> str | None:
    """One method's entry in the methods list (name, citation, parameters), or None for a name with no builder."""
    method = build_method(name) if name in BUILDERS else None
    if method is None:
        return None
    params = ", ".join(f"{k} = {_value(v)}" for k, v in method.params.items())
    chosen = manifest.get("conventions", {}).get(name, {})
    if chosen:  # what the method chose on each model (Grad-CAM's layer)
        params += ("; " if params else "") + "layer weighed: " + ", ".join(
            f"{facts['layer']} on {model}" for model, facts in chosen.items())
    unfit = manifest.get("not_applicable", {}).get(name, {})
    if unfit:
        params += ("; " if params else "") + "not applicable to " + ", ".join(unfit)
    return f"{name} {_cite(method.cite)}" + (f" ({params})" if params else "")


def _methods_paragraph(manifest: dict[str, Any], config: dict[str, Any]) -> str:
    """The attribution methods paragraph: the methods by family, their parameters and how the maps are computed."""
    methods = [entry for name in config["methods"] if (entry := _method_entry(manifest, name)) is not None]
    families = style.by_family(config["methods"])
    return (f"{len(methods)} methods in {len(families)} families "
            f"({'; '.join(f'{f}: {len(ms)}' for f, ms in families.items())}): {_join(methods)}. "
            "Maps are computed by the toolkit's rule engine; the gradient, input-times-gradient, integrated "
            "gradients, SmoothGrad, guided backpropagation and DeepLIFT maps match Captum "
            f"{_cite(['kokhlikyan2020'])} to numerical precision in the toolkit's tests."
            + (f" PatternNet and PatternAttribution fit their signal patterns on {_pattern_data(manifest)} "
               "and fit them again, on the same images, for the model of every randomization stage (Sixt et "
               "al.'s code kept the trained patterns in the randomized models' backward pass) "
               f"{_cite(['kindermans2018', 'sixt2020'])}."
               if {"patternnet", "patternattribution"} & set(config["methods"]) else ""))


def _check_paragraph(manifest: dict[str, Any], config: dict[str, Any], name: str) -> tuple[str, str]:
    """(heading, text) for one check: its source, parameters, coverage, verdict rule and twins."""
    check = CHECKS[name]
    options = [o for o in check.options.declared() if o.name in config]
    text = f"After {_cite(check.cite)}: {check.description}."
    if options:
        text += " Parameters: " + "; ".join(f"{o.name} = {_value(config[o.name])} ({o.help})" for o in options) + "."
    covered = manifest.get("coverage", {}).get(name, {})
    if covered:
        text += " " + _coverage_sentence(covered)
    rule = check.verdict
    if rule is not None and (not rule.threshold or rule.threshold in config):  # a scale rule reads no threshold
        text += f" A method is {rule.rule_text(check.options_from(config))}."
    if check.twins == "labels":
        text += _twin_sentence(manifest, name)
    return check.title, text


def _level(config: dict[str, Any]) -> str:
    """The level of one look's intervals in the run the manifest's ``config`` records, as a percentage."""
    looks = looks_of(config["n_images"], config.get("max_images")) if config.get("n_images") else 1
    return f"{look_level(looks, family_of(list(config.get('tests', [])))):.2%}"


def _statistics_paragraph(config: dict[str, Any], bort: bool) -> str:
    """The statistics paragraph: outcomes, intervals, similarity measures and, with Bort models, the paired test."""
    return ("A sanity check can reject a method, not certify it: each check's outcome is "
            "rejected, not rejected or inconclusive (an interval that contains the threshold, or fewer than half "
            "of the images, or fewer than three, with a defined score). "
            f"Scores are medians over images with {_level(config)} bootstrap confidence intervals (10,000 "
            f"resamples) {_cite(['efron1993'])}, a level set so that a method's family-wise error over the checks' "
            f"readings is at most 5 % (Bonferroni). SSIM {_cite(['wang2004'])} is computed on maps normalised to [0, 1] by "
            "the toolkit's batched port of scikit-image's structural_similarity "
            f"{_cite(['vanderwalt2014'])}, with a uniform 5 x 5 window and data range 1, equal to it in the "
            "toolkit's tests; it takes the larger of the SSIM with the second map and with its sign flip only "
            "where the two maps are not of one sign. The signed Spearman correlation is computed on the signed "
            "maps (channel sums), also for the methods whose heatmap is the largest magnitude over channels. "
            "The interval of CSC's pooled median is a cluster bootstrap over images"
            + (f". The checks' settings follow the {config['protocol']} protocol where the toolkit has an option "
               "for them" if config.get("protocol", "toolkit") != "toolkit" else "")
            + (f"; baselines and their Bort twins are compared per image with the paired Wilcoxon signed-rank "
               f"test {_cite(['wilcoxon1945'])}." if bort else "."))


def _software_paragraph(manifest: dict[str, Any], config: dict[str, Any]) -> str:
    """The software paragraph: seed, device, arithmetic precision, image blocks and library versions."""
    versions = manifest.get("versions", {})
    listed = ", ".join(f"{k} {v}" + (f" {_cite(['paszke2019'])}" if k == "torch" else "") for k, v in versions.items())
    precision = manifest.get("precision", {})
    if precision.get("mixed"):
        agreement = precision.get("agreement", {})
        worst = min(agreement.values()) if agreement else float("nan")
        arithmetic = (f"Maps were computed under automatic mixed precision ({precision.get('dtype')}); per model and "
                      f"method the cosine similarity between these maps and float32 maps of two images was at least "
                      f"{worst:.3f} (each value is in the run's manifest).")
    else:
        arithmetic = "Maps were computed in float32."
    block = config.get("image_block", 0)
    if block:
        arithmetic += (f" The checks scored per image ran on blocks of {block} images, each seeded by its unit and "
                       "its first image.")
    return f"Audit seed {config['seed']}, device {config.get('device', 'cpu')}. {arithmetic} {listed}."


def _deciding(config: dict[str, Any], name: str, pairs: int) -> str:
    """A check in a few words: its name, the measure its verdict reads and the settings that decide it (the options
    its rule reads, else the controls' scale; the twin pairs of a check that reads twins)."""
    check = CHECKS[name]
    rule = check.verdict
    if rule is None:
        return f"{check.title.lower()} {_cite(check.cite)} (shown, no verdict)"
    options = check.options_from(config)
    read = [f"{o} {_value(getattr(options, o))}" for o in rule.reads] or [rule.read_against]
    twins = [f"{pairs} twin pair{'s' * (pairs != 1)}"] if check.twins == "labels" and pairs else []
    return f"{check.title.lower()} {_cite(check.cite)} ({', '.join([rule.score_name, *read, *twins])})"


def summary(manifest: dict[str, Any], models: pd.DataFrame) -> str:
    """The methods in one paragraph a paper can paste (about 250 words at most for the demo's run): models, data,
    methods, checks with the settings that decide their verdicts, intervals, error rate, seed and versions; the
    full text (:func:`paragraphs`) and the configuration are in the appendix and the manifest."""
    config = manifest["config"]
    pairs = max((len(r.get("pairs", [r])) for r in manifest.get("twins", {}).values()), default=0)
    models_text, _ = _models_paragraph(models)
    n = manifest.get("images", {}).get("n", config["n_images"])
    source, _ = DATA.get(config["data"], (f"images from {config['data']}", ""))
    looks = looks_of(config["n_images"], config.get("max_images")) if config.get("n_images") else 1
    family = family_of(list(config.get("tests", [])))
    checks = [name for name in config["tests"] if name in CHECKS]
    readings = sum(rule.readings for c in checks if (rule := CHECKS[c].verdict) is not None)
    sequential = (f", read in up to {looks} looks of {config['n_images']} images, each at {look_level(looks, family):.2%}"
                  if looks > 1 else "")
    versions = manifest.get("versions", {})
    software = ", ".join(f"{k} {versions[k]}" for k in ("attribution-audit", "torch") if k in versions)
    return (f"{models_text} Data: {n} {source}, class-balanced; each map explains the image's true class. "
            f"Methods: {_join(list(config['methods']))}. Checks: "
            f"{_join([_deciding(config, c, pairs) for c in checks])}; a check rejects a method, does not reject it "
            "or is inconclusive (a sanity check cannot certify a method). Scores are medians over images with "
            f"{look_level(1, family):.2%} bootstrap intervals (10,000 resamples) {_cite(['efron1993'])}{sequential}; "
            f"a method's family-wise error over its {readings} rejecting readings is at most "
            f"{family_bound(readings):.1%} (Bonferroni). Seed {config['seed']}" + (f"; {software}" if software else "")
            + ". The full protocol is in the appendix.")


def paragraphs(manifest: dict[str, Any], models: pd.DataFrame) -> list[tuple[str, str]]:
    """(heading, text) pairs: models, data, attribution methods, checks, statistics, software."""
    config = manifest["config"]
    models_text, bort = _models_paragraph(models)
    out = [("Models", models_text),
           ("Data", _data_paragraph(manifest, config)),
           ("Attribution methods", _methods_paragraph(manifest, config))]
    out += [_check_paragraph(manifest, config, name) for name in config["tests"]]
    out.append(("Statistics", _statistics_paragraph(config, bort)))
    out.append(("Software", _software_paragraph(manifest, config)))
    return out


def cited(pairs: list[tuple[str, str]]) -> list[str]:
    """Every key the text cites, in order of first citation."""
    keys = [k.strip().lstrip("@") for _, text in pairs for group in CITATION.findall(text) for k in group.split(";")]
    return list(dict.fromkeys(keys))


def author_year(text: str) -> str:
    """``text`` with its citations as author-year text: "(Sixt et al., 2020)"."""
    def cite(match: re.Match[str]) -> str:
        return "(" + "; ".join(short(k.strip().lstrip("@")) for k in match.group(1).split(";")) + ")"

    return CITATION.sub(cite, text)


def markdown(pairs: list[tuple[str, str]], brief: str = "") -> str:
    """``methods.md``: the ``brief`` paragraph (:func:`summary`) first where given, then the full text with bold
    run-in headings, author-year citations, the reference list at the end."""
    lines = ["# Methods", ""] + ([author_year(brief), "", "## In full", ""] if brief else [])
    lines += [f"**{h}.** {author_year(t)}" + "\n" for h, t in pairs]
    lines += ["## References", ""]
    lines += [f"- {short(k)}. {plain(REFERENCES[k].title)}." for k in cited([*pairs, ("", brief)])]
    return "\n".join(lines) + "\n"


def latex(pairs: list[tuple[str, str]]) -> str:
    """``methods.tex``: one ``\\paragraph`` per heading, citations as natbib's ``\\citep``."""
    parts = ["% requires \\usepackage{natbib} and references.bib"]
    for heading, text in pairs:
        pieces, last = [], 0
        for match in CITATION.finditer(text):
            pieces.append(escape(text[last:match.start()]))
            pieces.append("\\citep{" + ",".join(k.strip().lstrip("@") for k in match.group(1).split(";")) + "}")
            last = match.end()
        pieces.append(escape(text[last:]))
        parts.append(f"\\paragraph{{{escape(heading)}.}} {''.join(pieces)}\n")
    return "\n".join(parts)
