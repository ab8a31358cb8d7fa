"""--device cuda: a clear error without a GPU; with one, the CPU's numbers to 1e-4 relative."""
import numpy as np
import pytest
import torch

from audit.errors import ConfigError
from audit.run.config import load_config
from audit.run.runner import run_audit

# SmoothGrad's noise comes from the device's own generator (captum's NoiseTunnel): left out
METHODS = ["gradient", "guided-backprop", "lrp-epsilon", "lrp-zplus", "deeplift", "integrated-gradients", "edge",
           "random"]
TESTS = ["csc", "random-logit", "cascading", "emprt", "smprt", "input-invariance"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the parity test runs instead")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    config = load_config(models=["cnn-sgd"], methods=["gradient"], tests=["random-logit"], n_images=2, device="cuda")
    with pytest.raises(ConfigError, match="no CUDA device here; use --device cpu"):
        run_audit(config, tmp_path / "run", progress=False, log=lambda s: None)
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gives_the_cpus_numbers(tmp_path):
    base = dict(models=["cnn-sgd", "resnet-sgd"], methods=METHODS, tests=TESTS, n_images=4, smprt_samples=4)
    cpu = run_audit(load_config(**base), tmp_path / "cpu", progress=False, log=lambda s: None)
    gpu = run_audit(load_config(**base, device="cuda"), tmp_path / "gpu", progress=False, log=lambda s: None)
    assert gpu.manifest["memory"]["peak_of"] == "allocated GPU memory"
    for test in TESTS:
        a, b = cpu.tables[test], gpu.tables[test]
        assert a.shape == b.shape and list(a.columns) == list(b.columns), test
        for column in a.select_dtypes("number").columns:
            x, y = a[column].to_numpy(float), b[column].to_numpy(float)
            assert np.array_equal(np.isnan(x), np.isnan(y)), (test, column)
            ok = ~np.isnan(x)
            assert np.allclose(y[ok], x[ok], rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(x[ok]).max(initial=0)))), \
                (test, column, float(np.abs(y[ok] - x[ok]).max(initial=0)))
