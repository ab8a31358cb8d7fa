"""make test's profile reads its own output back: each job's wall time, each suite's passed tests and slowest tests."""
from benchmarks.suite_times import read, tables

PRINTED = """All checks passed!
model-library suite and mypy started beside the main suite; their logs: .test-libraries.log, .test-mypy.log
........................................................................ [100%]
============================= slowest 20 durations =============================
55.84s call     tests/attributions/test_memory.py::test_every_method_holds_a_small_budget_in_a_fresh_process
40.42s call     tests/test_examples.py::test_python_block_runs[docs/getting-started.md#0-import torch\\nfrom audit import x]
28.63s setup    tests/test_docs.py::test_every_check_has_a_page_listing_its_options
1230 passed, 33 skipped, 26 warnings in 461.50s (0:07:41)
--- mypy (.test-mypy.log) ---
Success: no issues found in 157 source files
mypy took 61 s
--- model-library suite (.test-libraries.log) ---
============================= slowest 10 durations =============================
61.62s call     tests/benchmarks/test_method_sweep.py::test_the_sweep_holds_on_a_sample_of_the_library_models
67 passed, 5 warnings in 171.30s (0:02:51)
============================= slowest 5 durations =============================
195.10s call     tests/test_model_libraries.py::test_every_classifier_is_exact_or_refused_at_capture[timm]
74.56s call     tests/test_model_libraries.py::test_every_classifier_is_exact_or_refused_at_capture[torchvision]
3 passed in 300.00s (0:05:00)
"""


def test_the_profile_reads_each_jobs_time_and_each_suites_slowest_tests():
    walls, passed, slowest = read(PRINTED)
    assert walls == {"main suite": 461.5, "mypy": 61.0, "model-library suite": 471.3}
    assert passed == {"main suite": 1230, "model-library suite": 70}
    memory = "tests/attributions/test_memory.py::test_every_method_holds_a_small_budget_in_a_fresh_process"
    assert slowest["main suite"][0] == (55.84, memory)
    assert slowest["main suite"][1][1] == "tests/test_examples.py::test_python_block_runs"  # a code block is no name
    assert [s for s, _ in slowest["model-library suite"]] == [195.10, 74.56, 61.62]  # both of its processes
    text = tables(900.0, PRINTED)
    assert text.startswith("`make test`: **15.0 min** wall (the budget: 15 min on 2 cores)")
    assert "| main suite | 1230 | 462 |" in text and "| mypy |  | 61 |" in text and "| model-library suite | 70 | 471 |" in text
