"""Cached derived values (sign-split weights, the reference pass) follow every way a weight can change."""
import torch
from torch import nn

from attributions import Explainer
from attributions.derived import Derived
from tests.engine_models import ResidualNet


def _counted(derived: Derived, sources: list[torch.Tensor], calls: list[int]) -> torch.Tensor:
    def make():
        calls.append(1)
        return sources[0].sum()
    return derived.get(sources, make)


def test_derived_is_recomputed_when_a_source_changes_in_any_way():
    p = nn.Parameter(torch.arange(4096, dtype=torch.float64))
    derived: Derived = Derived()
    calls: list[int] = []
    first = _counted(derived, [p], calls)
    assert _counted(derived, [p], calls) == first and len(calls) == 1  # unchanged: kept
    with torch.no_grad():
        p.mul_(2)  # in place under no_grad: the version counter moves
    assert _counted(derived, [p], calls) == 2 * first and len(calls) == 2
    p.data.copy_(torch.ones(4096))  # through .data: no version bump, the value sample differs
    assert _counted(derived, [p], calls) == 4096 and len(calls) == 3
    p.data = torch.zeros(4096, dtype=torch.float64)  # new storage
    assert _counted(derived, [p], calls) == 0 and len(calls) == 4
    q = nn.Parameter(torch.zeros(4096, dtype=torch.float64))  # another tensor with the same values
    assert _counted(derived, [q], calls) == 0 and len(calls) == 5
    assert derived.get([q], lambda: torch.tensor(7.0), key="other shape") == 7.0  # the key is part of it


def test_derived_sees_writes_to_a_transposed_source_and_to_any_dtype():
    # the samples are read through views kept on each source's storage: a non-contiguous source is read
    # whole, and sources of several dtypes are compared per dtype
    w = nn.Parameter(torch.randn(64, 32, dtype=torch.float64).t())
    steps = torch.zeros((), dtype=torch.int64)
    derived: Derived = Derived()
    calls: list[int] = []
    _counted(derived, [w, steps], calls)
    w.data[5, 7] += 1.0  # through .data: no version bump, and off the strided sample of a contiguous one
    _counted(derived, [w, steps], calls)
    steps.data.fill_(1)
    _counted(derived, [w, steps], calls)
    _counted(derived, [w, steps], calls)
    assert len(calls) == 3


def test_cached_weights_and_reference_follow_the_model():
    torch.manual_seed(0)
    model = ResidualNet().double().eval()
    x = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    methods = ("lrp-alpha2beta1", "deep-taylor", "deeplift", "lrp-gamma")
    explainers = {m: Explainer(model, m) for m in methods}
    for ex in explainers.values():
        ex.attribute(x, target=1)  # fills the caches
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    for m, ex in explainers.items():
        fresh = Explainer(model, m).attribute(x, target=1)
        assert torch.equal(ex.attribute(x, target=1), fresh), m
