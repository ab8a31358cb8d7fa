"""Which hooks may change what a model computes, read from their code: in-place writes through helpers,
aliases, loops and augmented assignment are found; observers (that store or log) are not refused."""
import torch
import torch.nn.functional as F
from torch import nn

from attributions.bytecode import read_hook
from attributions.hooks import changes, forward_changing_hooks
from tests.attributions import bytecode_cases as cases

STORE = cases.STORE  # a lambda storing into a global observes


def via_init(module, args, out):  # torch's own in-place function and keyword, beside the cases' stand-ins
    torch.nn.init.zeros_(out)


def via_inplace_keyword(module, args, out):
    F.relu(out, inplace=True)


def test_hooks_writing_in_place_through_helpers_aliases_and_operators_are_found():
    for hook in (cases.helper, cases.nested_helper, cases.alias, cases.loop, cases.unpacking, cases.augmented,
                 via_init, via_inplace_keyword, cases._closure_writer(), cases._Scaler(), cases._Scaler().__call__):
        assert read_hook(hook).writes and changes(hook), hook


def test_observing_hooks_are_not_refused():
    for hook in (cases.observer_helper, cases.rebinding, cases.logging_, cases._Recorder(),
                 lambda m, a, o: STORE.__setitem__("c", o)):
        assert not changes(hook), hook


def test_each_finding_is_exact_on_a_real_forward():
    """What the reading says agrees with what the hook does to a real forward: the writers change the output,
    the observers leave it as it was."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    for hook, writes in ((cases.helper, True), (cases.alias, True), (cases.augmented, True), (via_inplace_keyword, True),
                         (cases._Scaler(), True), (cases.getattr_known_name, True), (cases.bound_method_local, True),
                         (cases.setattr_, True), (cases.operator_in_place, True), (cases.nested_def, True),
                         (cases.items_builtin, True), (cases.observer_helper, False), (cases.rebinding, False),
                         (cases._Recorder(), False), (cases.nested_observer, False), (cases.rows_copied, False)):
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 2, 3)).eval()
        register = model[0].register_forward_pre_hook if hook is cases.items_builtin else model[0].register_forward_hook
        with torch.no_grad():
            plain = model(x)
            handle = register(hook)
            hooked = model(x)
        assert (not torch.equal(plain, hooked)) == writes, hook
        assert len(forward_changing_hooks(model)) == writes, hook
        handle.remove()
