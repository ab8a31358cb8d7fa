"""Memory of a run: sizes, the default budget, the peak per unit, and what the manifest records."""
import json

import numpy as np
import pytest
import torch

from audit.errors import ConfigError
from audit.run.config import load_config
from audit.run.resources import Peak, available_bytes, budget_bytes, keep_freed_memory, parse_size
from audit.run.runner import run_audit


@pytest.mark.parametrize("text,nbytes", [("4GB", 4 * 2**30), ("512 MB", 512 * 2**20), ("1.5GiB", 3 * 2**29),
                                         ("2g", 2 * 2**30), ("134217728", 2**27), (2**27, 2**27)])
def test_sizes(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text,match", [("lots", "such as 4GB"), ("4 parsecs", "such as 4GB"), ("-1GB", "such as 4GB"),
                                        ("1MB", "at least 64MB"), ("", "such as 4GB")])
def test_bad_sizes_are_named(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_size(text)


def test_the_default_budget_is_half_of_what_is_available():
    cpu = torch.device("cpu")
    assert budget_bytes("1GB", cpu) == 2**30
    free = available_bytes(cpu)
    assert 0 < budget_bytes(None, cpu) <= free // 2 * 1.2  # memory moves a little between two readings


def test_the_peak_is_reset_for_each_block():
    peak = Peak(torch.device("cpu"))
    with peak.track():
        big = np.ones(300 * 2**20 // 8)  # 300 MB, touched
        big[::512] = 2.0
        del big
    first = peak.nbytes
    with peak.track():
        small = np.ones(2**20)
        del small
    assert first is not None and peak.nbytes is not None
    assert first - peak.nbytes > 250 * 2**20  # the second block does not inherit the first's peak


def test_the_manifest_records_the_budget_and_each_units_peak(tmp_path):
    config = load_config(models=["cnn-sgd"], methods=["gradient", "lrp-zplus"], tests=["random-logit"], n_images=2,
                         max_memory="256MB")
    result = run_audit(config, tmp_path / "run", progress=False, log=lambda s: None)
    record = result.manifest["memory"]
    assert record["budget_bytes"] == 256 * 2**20
    assert set(record["peak_mb"]) == {"cnn-sgd/random-logit/gradient", "cnn-sgd/random-logit/lrp-zplus"}
    assert all(50 < v < 24 * 2**10 for v in record["peak_mb"].values())  # the process's resident memory, in MB
    assert result.manifest["precision"] == {"mixed": False}


def test_a_resumed_run_keeps_the_recorded_budget_unless_given_another(tmp_path):
    base = dict(models=["cnn-sgd"], methods=["gradient"], tests=["random-logit", "cascading"], n_images=2)
    out = tmp_path / "run"
    run_audit(load_config(**base), out, progress=False, log=lambda s: None)
    manifest = json.loads((out / "manifest.json").read_text())
    first = manifest["memory"]["budget_bytes"]
    (out / "units" / "cnn-sgd" / "cascading" / "gradient.csv").unlink()
    again = run_audit(load_config(**base), out, resume=True, progress=False, log=lambda s: None)
    assert again.manifest["memory"]["budget_bytes"] == first  # not today's free memory
    (out / "units" / "cnn-sgd" / "cascading" / "gradient.csv").unlink()
    lower = run_audit(load_config(**base, max_memory="128MB"), out, resume=True, progress=False, log=lambda s: None)
    assert lower.manifest["memory"]["budget_bytes"] == 128 * 2**20  # a new budget may be given after running out


def test_mixed_precision_records_each_methods_agreement_with_float32(tmp_path):
    lines = []
    config = load_config(models=["cnn-sgd"], methods=["gradient", "lrp-alpha2beta1"], tests=["random-logit"],
                         n_images=2, mixed_precision=True)
    result = run_audit(config, tmp_path / "run", progress=False, log=lines.append)
    precision = result.manifest["precision"]
    assert precision["mixed"] is True and precision["dtype"] == "bfloat16"
    agreement = precision["agreement"]
    assert agreement["cnn-sgd/gradient"] > 0.95  # bfloat16 keeps 8 bits: the gradient moves a little
    # alpha2beta1 subtracts two large relevances: at bfloat16's 8 bits the difference is lost
    assert agreement["cnn-sgd/lrp-alpha2beta1"] < 0.5
    assert any("lrp-alpha2beta1" in line and "float32" in line for line in lines)
    table = result.tables["random-logit"]
    assert np.isfinite(table.ssim).all()


def test_the_allocator_keeps_freed_memory_on_glibc_unless_told_not_to(monkeypatch):
    import platform
    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")
    monkeypatch.setenv("AUDIT_SYSTEM_MALLOC", "1")
    assert keep_freed_memory() is False
