import os
from pathlib import Path

import pytest

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture
def full_fashion_mnist():
    """The full Debian Fashion-MNIST: required in CI (it installs it), skipped elsewhere when absent."""
    if not (DEBIAN_FMNIST / "t10k-labels-idx1-ubyte.gz").exists():
        if os.environ.get("CI"):
            pytest.fail(f"{DEBIAN_FMNIST} is missing in CI: `make data` should have installed dataset-fashion-mnist")
        pytest.skip(f"{DEBIAN_FMNIST} missing (apt-get install dataset-fashion-mnist)")
    return DEBIAN_FMNIST


@pytest.fixture
def isolated_data_env(tmp_path, monkeypatch):
    """No $AUDIT_DATA, and a private cache folder, so lookups see only what a test puts there."""
    monkeypatch.delenv("AUDIT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path

