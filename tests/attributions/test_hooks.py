"""Which hooks may change what a model computes, read from their code: in-place writes through helpers,
aliases, loops and augmented assignment are found; observers (that store or log) are not refused."""
import logging

import torch
import torch.nn.functional as F
from torch import nn

from attributions.bytecode import read_hook
from attributions.hooks import changes, forward_changing_hooks

STORE: dict = {}
LOG = logging.getLogger("hooks-test")


def _scale(tensor, factor):  # a helper that writes into what it is given
    tensor.mul_(factor)


def _scale_first(values):
    _scale(values[0], 2.0)  # two helpers deep


def _remember(name, tensor):  # a helper that only reads
    STORE[name] = tensor.detach().clone()


class _Scaler:
    """A callable hook object that writes through one of its own methods."""

    def __init__(self):
        self.calls = 0

    def __call__(self, module, args, out):
        self.calls += 1  # its own state: not the module's computation
        self.halve(out)

    def halve(self, tensor):
        tensor.div_(2)


class _Recorder:
    def __init__(self):
        self.kept = []

    def __call__(self, module, args, out):
        self.kept.append(out.detach())
        self.log(out)

    def log(self, tensor):
        LOG.debug("mean %s", tensor.mean())


def via_helper(module, args, out):
    _scale(out, 2.0)


def via_nested_helper(module, args):
    _scale_first(args)


def via_alias(module, args, out):
    first = out[0]
    first.clamp_(min=0)


def via_loop(module, args):
    for tensor in args:
        tensor.zero_()


def via_unpacking(module, args):
    (x,) = args
    x[0] = 1.0


def via_augmented_assignment(module, args, out):
    out *= 2  # in place on a tensor, returns None


def via_init(module, args, out):
    torch.nn.init.zeros_(out)


def via_inplace_keyword(module, args, out):
    F.relu(out, inplace=True)


def via_closure():
    def hook(module, args, out):
        _scale(out, 3.0)
    return hook


def observer_helper(module, args, out):
    _remember("conv", out)


def observer_rebinding(module, args, out):
    out = out * 2  # a new tensor bound to the name: the module's output is unchanged
    STORE["doubled"] = out


def observer_logging(module, args, out):
    LOG.info("shape %s, norm %.3f", tuple(out.shape), out.norm().item())


def test_hooks_writing_in_place_through_helpers_aliases_and_operators_are_found():
    for hook in (via_helper, via_nested_helper, via_alias, via_loop, via_unpacking, via_augmented_assignment,
                 via_init, via_inplace_keyword, via_closure(), _Scaler(), _Scaler().__call__):
        assert read_hook(hook).writes and changes(hook), hook


def test_observing_hooks_are_not_refused():
    for hook in (observer_helper, observer_rebinding, observer_logging, _Recorder(),
                 lambda m, a, o: STORE.__setitem__("c", o)):
        assert not changes(hook), hook


def test_each_finding_is_exact_on_a_real_forward():
    """What the reading says agrees with what the hook does to a real forward: the writers change the output,
    the observers leave it as it was."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    for hook, writes in ((via_helper, True), (via_alias, True), (via_augmented_assignment, True),
                         (via_inplace_keyword, True), (_Scaler(), True), (observer_helper, False),
                         (observer_rebinding, False), (_Recorder(), False)):
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 2, 3)).eval()
        with torch.no_grad():
            plain = model(x)
            handle = model[0].register_forward_hook(hook)
            hooked = model(x)
        assert (not torch.equal(plain, hooked)) == writes, hook
        assert len(forward_changing_hooks(model)) == writes, hook
        handle.remove()
