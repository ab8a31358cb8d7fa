"""The answer at a glance: the matrix, the compact cells, the sentences and the undecided cells, read from the
verdict table's data; and the readings they show, against hand-derived numbers."""
import numpy as np
import pandas as pd

from audit.checks.base import INCONCLUSIVE, NOT_REJECTED, REJECTED, Reading, VerdictCell, scored_cell
from audit.run.config import load_config
from reports.answer import compact_table, how_to_read, matrix_table, rejected_sentences, undecided


def _row(model, method, csc, logit, *, role="method", found=None, verdict=None, needed=None):
    cells = {"csc": csc, "random-logit": logit}
    reading = Reading("after a.long.module.path.fc", 0.9123, -0.1, 0.99, 0.5, 16)
    verdict = verdict or (REJECTED + ": csc (chain converges)" if REJECTED in (csc, logit) else NOT_REJECTED)
    return {"model": model, "method": method, "role": role, "mechanisms": found or {}, "verdict": verdict,
            "outcome": verdict.split(":")[0],
            "mechanism": "csc: rank-1 chain convergence" if found else "",
            **{f"outcome_{c}": o for c, o in cells.items()},
            **{f"short_{c}": VerdictCell(0.9, "", o or None, reading=reading).short() for c, o in cells.items()},
            **{f"needed_{c}": needed if o == INCONCLUSIVE else None for c, o in cells.items()},
            **{f"reason_{c}": REASONS[c] if o == REJECTED else "" for c, o in cells.items()}}


REASONS = {"csc": "chain converges", "random-logit": "class-insensitive"}


def _verdict():
    return pd.DataFrame([
        _row("m1", "gradient", NOT_REJECTED, NOT_REJECTED),
        _row("m1", "lrp-zplus", REJECTED, NOT_REJECTED, found={"csc": ["rank-1 chain convergence"]}),
        _row("m1", "edge", "", REJECTED, role="control", verdict=REJECTED + ": random-logit (class-insensitive)"),
        _row("m2", "gradient", NOT_REJECTED, INCONCLUSIVE, verdict=INCONCLUSIVE + ": random-logit", needed=61),
        _row("m2", "lrp-zplus", REJECTED, NOT_REJECTED, found={"csc": ["rank-1 chain convergence"]}),
        _row("m2", "edge", "", REJECTED, role="control", verdict=REJECTED + ": random-logit (class-insensitive)"),
    ])


def test_the_matrix_marks_each_check_and_model_the_mechanism_by_letter_and_the_controls_last():
    matrix = matrix_table(_verdict()).set_index("method")
    assert list(matrix.index) == ["gradient", "lrp-zplus", "edge"]
    assert list(matrix.columns) == ["m1: csc", "m1: random-logit", "m2: csc", "m2: random-logit"]
    assert matrix.loc["lrp-zplus", "m1: csc"] == "\u2717C" and matrix.loc["lrp-zplus", "m1: random-logit"] == "\u2013"
    assert matrix.loc["gradient", "m2: random-logit"] == "?" and matrix.loc["edge", "m1: csc"] == ""


def test_a_check_run_on_no_model_leaves_no_empty_column():
    verdict = _verdict().assign(**{"outcome_csc": ""})
    assert list(matrix_table(verdict).columns) == ["method", "m1: random-logit", "m2: random-logit"]


def test_compact_cells_stay_within_forty_characters_and_say_the_reading():
    table = compact_table(_verdict())
    assert list(table.columns) == ["model", "method", "csc", "random-logit", "verdict", "mechanism"]
    cells = [str(v) for v in table[["csc", "random-logit"]].to_numpy().ravel()]
    # the 27-character label is cut to its last 19 after an ellipsis, which keeps the layer's end
    assert cells[0] == "\u2013 \u2026long.module.path.fc 0.91 [-0.10, 0.99]" and max(map(len, cells)) <= 42
    assert table.loc[1, "verdict"] == REJECTED and table.loc[1, "mechanism"] == "C"
    assert table.loc[2, "csc"] == "n/a"  # the check says nothing of the edge map


def test_each_rejected_method_gets_a_sentence_and_each_undecided_cell_the_images_it_needs():
    # one sentence per method, its models gathered per check; the controls' rejections are not sentences
    assert rejected_sentences(_verdict()) == ["lrp-zplus is rejected by csc on both models (chain converges; "
                                              "mechanism: rank-1 chain convergence)."]
    assert rejected_sentences(_verdict().iloc[:3]) == ["lrp-zplus is rejected by csc on m1 (chain converges; "
                                                       "mechanism: rank-1 chain convergence)."]
    two = _verdict()
    two.loc[4, ["outcome_random-logit", "reason_random-logit"]] = [REJECTED, "class-insensitive"]
    assert rejected_sentences(two) == ["lrp-zplus is rejected by csc on both models (chain converges; mechanism: "
                                       "rank-1 chain convergence) and random-logit on m2 (class-insensitive; no "
                                       "mechanism measured)."]
    assert undecided(_verdict()).startswith("1 cells are inconclusive")
    assert "gradient on m2 (random-logit, about 61 images)" in undecided(_verdict())
    assert undecided(_verdict().iloc[:3]) == "No cell is inconclusive."


def test_a_readings_images_needed_scale_as_the_square_of_its_half_width_over_its_distance():
    # 16 images, half-width 0.2, 0.1 from the threshold: (0.2 / 0.1)^2 = 4 times the images
    assert Reading("", 0.6, 0.4, 0.8, 0.5, 16).images_needed() == 64
    assert Reading("", 0.5, 0.4, 0.6, 0.5, 16).images_needed() is None  # the estimate at the threshold
    assert Reading("", 0.6, 0.4, 0.8, float("nan"), 16).images_needed() is None  # no one number decides it
    assert Reading("", 0.6, 0.4, 0.8, 0.5, 0).images_needed() is None  # not read on images


def test_a_scored_cell_carries_its_reading_against_its_threshold():
    values = np.linspace(0.7, 0.9, 21)
    cell = scored_cell(values, 0.8, label="a long label for the text", short="stage", level=0.99)
    assert cell.outcome == INCONCLUSIVE and cell.reading is not None
    assert (cell.reading.label, cell.reading.at, cell.reading.images) == ("stage", 0.8, 21)
    assert cell.reading.estimate == cell.score == np.median(values)
    assert cell.short().startswith("? stage 0.80 [") and VerdictCell(np.nan, "n/a", None).short() == "n/a"


def test_how_to_read_has_a_row_per_check_with_its_question_and_what_rejects():
    config = load_config(models=["m1"], methods="gradient", tests="csc,random-logit")
    table = how_to_read(_verdict(), config)
    assert list(table.check) == ["csc", "random-logit"]
    assert table.loc[1, "question"] == "Does the map change with the explained class?"
    assert table.loc[1, "rejected when"] == "the median SSIM's interval at or above 0.8"
