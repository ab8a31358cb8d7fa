"""The methods text: what the run recorded, each check's parameters and threshold, citations."""
import pandas as pd

from audit.run.config import load_config
from reports import methods_text
from reports.references import REFERENCES


def manifest(**overrides) -> dict:
    config = load_config(models=["cnn-sgd", "cnn-bort"], methods=["gradient", "lrp-zplus", "smoothgrad"],
                         tests=["csc", "random-logit", "cascading"], n_images=12, seed=7, **overrides)
    return {"config": config.to_dict(), "images": {"n": 12}, "versions": {"torch": "2.13.0", "captum": "0.9.0"}}


MODELS = pd.DataFrame([{"model": "cnn-sgd", "arch": "cnn", "optimizer": "sgd", "test_accuracy": 0.9213},
                       {"model": "cnn-bort", "arch": "cnn", "optimizer": "bort", "test_accuracy": 0.9169}])


def test_paragraphs_state_models_data_checks_thresholds_and_versions():
    pairs = methods_text.paragraphs(manifest(random_logit_threshold=0.75), MODELS)
    text = dict(pairs)
    assert "92.13 %" in text["Models"] and "cnn-bort" in text["Models"] and "[@zhang2023bort]" in text["Models"]
    assert text["Data"].startswith("12 ") and "class-balanced" in text["Data"] and "seed 7" in text["Software"]
    assert "smoothgrad [@smilkov2017] (noise = 0.15, samples = 50, seed = 0)" in text["Attribution methods"]
    assert "rejected (class-insensitive)" in text["Random-logit test"] and "at or above 0.75" in text["Random-logit test"]
    assert "inconclusive when it contains the threshold" in text["Random-logit test"]
    assert "n_vectors = 5" in text["Cosine-similarity convergence"]
    assert "torch 2.13.0 [@paszke2019]" in text["Software"]
    assert [h for h, _ in pairs][-2:] == ["Statistics", "Software"]


def test_citations_render_per_format_and_every_cited_key_exists():
    pairs = methods_text.paragraphs(manifest(), MODELS)
    keys = methods_text.cited(pairs)
    assert keys and set(keys) <= set(REFERENCES) and len(keys) == len(set(keys))
    md = methods_text.markdown(pairs)
    assert "(Sixt et al., 2020)" in md and "[@" not in md and md.count("\n- ") == len(keys)
    tex = methods_text.latex(pairs)
    assert "\\citep{sixt2020}" in tex and "[@" not in tex and "\\paragraph{Models.}" in tex
    assert "92.13 \\%" in tex  # escaped for LaTeX


def test_a_run_without_bort_models_does_not_cite_bort():
    pairs = methods_text.paragraphs(manifest(), MODELS[MODELS.optimizer == "sgd"])
    assert "zhang2023bort" not in methods_text.cited(pairs) and "wilcoxon1945" not in methods_text.cited(pairs)


def test_the_arithmetic_and_the_image_blocks_are_stated():
    plain = dict(methods_text.paragraphs(manifest(), MODELS))["Software"]
    assert "computed in float32" in plain and "blocks" not in plain
    mixed = manifest(mixed_precision=True, image_block=4)
    mixed["precision"] = {"mixed": True, "dtype": "bfloat16", "agreement": {"cnn-sgd/gradient": 0.981,
                                                                           "cnn-sgd/lrp-zplus": 0.9957}}
    text = dict(methods_text.paragraphs(mixed, MODELS))["Software"]
    assert "mixed precision (bfloat16)" in text and "at least 0.981" in text
    assert "blocks of 4 images" in text


def test_a_randomization_check_says_what_its_stages_re_initialised():
    record = manifest()
    record["coverage"] = {"cascading": {
        "cnn-sgd": {"granularity": "layer", "stages": 6, "tensors": 12, "share_reinitialised": 1.0, "kept_trained": [],
                    "constant_default": [], "unchanged": []},
        "vit-sgd": {"granularity": "block", "stages": 9, "tensors": 46, "share_reinitialised": 0.994,
                    "kept_trained": ["bn.weight"], "constant_default": ["norm.weight", "norm.bias"], "unchanged": []}}}
    text = dict(methods_text.paragraphs(record, MODELS))["Parameter randomization (cascading)"]
    assert "cnn-sgd: 6 layer stages re-initialising 100.0 % of the parameters;" in text
    assert ("vit-sgd: 9 block stages re-initialising 99.4 % of the parameters (2 of its 46 tensors reset to a constant "
            "untrained default (normalisation weights 1, biases 0); 1 BatchNorm tensors kept trained)") in text
    assert "coverage" not in dict(methods_text.paragraphs(manifest(), MODELS))["Parameter randomization (cascading)"]


def test_a_model_of_unknown_training_is_not_said_to_be_trained_with_unknown():
    models = pd.DataFrame([{"model": "timm:resnet18", "arch": "timm:resnet18", "optimizer": "unknown",
                            "test_accuracy": float("nan")}])
    text = dict(methods_text.paragraphs(manifest(), models))["Models"]
    assert "unknown" not in text and "timm:resnet18 (architecture timm:resnet18)" in text


def test_a_verdict_read_on_the_controls_scale_states_its_rule_in_the_methods_text():
    """Cascading reads no threshold: its paragraph still says how it rejects, on the scale the controls measure."""
    text = dict(methods_text.paragraphs(manifest(), MODELS))
    cascading = text["Parameter randomization (cascading)"]
    assert "A method is rejected when the fully randomized model's map has a SSIM to the trained map nearer the edge " \
        "map's score (unchanged) than the random map's (unrelated)" in cascading


def test_the_brief_paragraph_names_what_decides_each_verdict_in_under_250_words():
    """The paragraph a paper pastes: the demo's run (4 checks, a twin check with three pairs, sequential looks)."""
    config = load_config(models=["cnn-sgd", "cnn-bort"], methods=["gradient", "lrp-zplus", "smoothgrad"],
                         tests=["csc", "random-logit", "cascading", "independent", "data-randomization"], n_images=16,
                         max_images=64, seed=7, random_logit_threshold=0.75)
    record = {"config": config.to_dict(), "images": {"n": 64}, "versions": {"torch": "2.13.0"},
              "twins": {"cnn-sgd": {"pairs": [{"spec": f"cnn-permuted-{k}"} for k in (1, 2, 3)]}}}
    brief = methods_text.summary(record, MODELS)
    plain = methods_text.author_year(brief)
    assert len(plain.split()) <= 250 and "{" not in plain and "[@" not in plain
    assert "csc_threshold 0.99" in brief and "random_logit_threshold 0.75" in brief and "randomization_top 1" in brief
    assert "Spearman of |map|, on the controls' scale, 3 twin pairs" in brief
    assert "parameter randomization (independent)" in brief and "(shown, no verdict)" in brief
    assert "up to 4 looks of 16 images" in brief and "at most 5.0%" in brief and "Seed 7; torch 2.13.0" in brief
    md = methods_text.markdown(methods_text.paragraphs(record, MODELS), brief)
    assert md.index(plain) < md.index("## In full") and "Efron" in md.split("## References")[1]  # the brief cites too


def test_no_paragraph_leaves_a_placeholder_unformatted():
    for heading, text in methods_text.paragraphs(manifest(), MODELS):
        assert "{" not in text and "}" not in text, heading
