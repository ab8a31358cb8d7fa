"""Shared fixtures of the check tests."""
import pytest
import torch

from audit.data.datasets import embedded_sample
from audit.models import load_checkpoint


@pytest.fixture(scope="module")
def trained():
    """The shipped cnn-sgd and 8 embedded images, one of each of 8 classes."""
    x, y = embedded_sample()
    return load_checkpoint("cnn-sgd"), torch.from_numpy(x[::125]), torch.from_numpy(y[::125])
