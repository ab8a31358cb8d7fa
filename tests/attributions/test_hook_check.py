"""A hook that changes what the model computes gets the toolkit's error (or a recorded warning) on every entry
point, whatever its code shows: the reading of its code refuses what it sees and names what it cannot follow, and
each capture runs the model's own forward, hooks and all, against the captured graph
(:mod:`attributions.hook_check`). Hooks that only observe are not refused, and the model is left as it was."""
import functools
import operator
import re
import warnings

import pytest
import torch
from torch import nn

from attributions import Explainer
from attributions.errors import AttributionError, ToolkitError, ToolkitWarning
from attributions.hook_check import check_hooked_forward, rounding
from attributions.hooks import forward_changing_hooks, unresolved_hooks

NAME = "mul_"  # a method's name in a global: the reading reads it, as it reads the helpers a hook calls
OPS: dict = {}  # empty: the name looked up in it is one no reading can know
SHARED: dict = {}


def by_getattr(module, args, out):  # (a) the example: doubles the output through getattr
    getattr(out, NAME)(2.0)


def by_unseen_name(module, args, out):  # (a) under a name only the running code knows
    getattr(out, OPS.get("scale", "mul_"))(2.0)


def by_dict(module, args, out):  # (b) a bound method kept in a dict, called from there
    methods = {"scale": out.mul_}
    methods["scale"](2.0)


def by_partial(module, args, out):  # (c)
    functools.partial(torch.Tensor.mul_, out)(2.0)


def by_methodcaller(module, args, out):  # (d)
    operator.methodcaller("mul_", 2.0)(out)


FORMS = [by_getattr, by_unseen_name, by_dict, by_partial, by_methodcaller]
UNRESOLVED = {by_unseen_name, by_dict, by_partial, by_methodcaller}  # warned of when read, refused when run


def _model(hook=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).double().eval()
    if hook is not None:
        model[0].register_forward_hook(hook)
    return model


@pytest.mark.parametrize("hook", FORMS, ids=lambda h: h.__name__)
def test_every_form_that_changes_the_output_is_refused_by_name_through_attribute(hook):
    model, x = _model(hook), torch.randn(2, 4, dtype=torch.float64)
    with torch.no_grad():
        assert not torch.allclose(model(x), _model()(x))  # the hook does change the output
    with warnings.catch_warnings(record=True) as said, pytest.raises(AttributionError) as refused:
        warnings.simplefilter("always")
        Explainer(model, "gradient").attribute(x, target=1)
    assert f"0: forward hook {hook.__qualname__}" in str(refused.value)
    warned = [str(w.message) for w in said if issubclass(w.category, ToolkitWarning)]
    if hook in UNRESOLVED:  # the reading names what it could not follow; the model's own forward shows the change
        assert len(unresolved_hooks(model)) == 1 and forward_changing_hooks(model) == []
        assert any(line.startswith(f"0: forward hook {hook.__qualname__} may write") for line in warned)
        assert "gives other logits than its modules' code" in str(refused.value)
    else:  # read to write in place: refused before anything runs
        assert forward_changing_hooks(model) == [f"0: forward hook {hook.__qualname__}"] and warned == []


def test_a_change_no_reading_of_code_can_see_is_refused_by_the_run():
    """Layer 0's hook keeps its output in a dict, and a pre-hook of layer 1 doubles what the dict holds: neither
    hands an argument to anything it cannot name, so the reading finds nothing; the output is changed all the
    same, and the capture's run of the model's own forward refuses it, naming both hooks."""
    def keep(module, args, out):
        SHARED["hidden"] = out

    def double_kept(module, args):
        SHARED["hidden"].mul_(2.0)

    model = _model(keep)
    model[1].register_forward_pre_hook(double_kept)
    assert forward_changing_hooks(model) == [] and unresolved_hooks(model) == []
    with pytest.raises(AttributionError, match=r"gives other logits .*0: forward hook .*keep; 1: forward pre hook "
                                               r".*double_kept\)"):
        Explainer(model, "gradient").attribute(torch.randn(2, 4, dtype=torch.float64), target=1)


def test_observing_hooks_raise_nothing_and_run_once_per_capture_on_the_checked_images():
    kept = []
    model = _model(lambda module, args, out: kept.append(out.detach().clone()))
    model.register_forward_pre_hook(lambda module, args: kept.append(args[0].shape))
    x = torch.randn(6, 4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ToolkitWarning, no other warning
        maps = Explainer(model, "gradient").attribute(x, target=1)
    torch.testing.assert_close(maps, Explainer(_model(), "gradient").attribute(x, target=1), rtol=0, atol=0)
    assert kept[0] == torch.Size([4, 4]) and kept[1].shape == (4, 4) and len(kept) == 2  # one forward of 4 images


def test_the_check_leaves_a_training_model_as_it_was():
    """Dropout and BatchNorm in training mode: the model's train-mode output differs from the graph's, which
    takes the eval branch; the check runs the forward in eval mode too, and restores flags, running statistics
    and the random generator."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 2)).double()
    seen = []
    model[1].register_forward_hook(lambda module, args, out: seen.append(module.training))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 4, dtype=torch.float64)
    generator = torch.get_rng_state()
    Explainer(model, "gradient").attribute(x, target=0)
    assert seen == [False] and all(m.training for m in model.modules())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(generator, torch.get_rng_state())


def test_a_hook_writing_a_buffer_is_undone_and_one_writing_a_parameter_is_refused():
    writers = {"buffer": lambda module: module.running_mean.add_(1.0), "weight": lambda module: module.weight.add_(1.0)}

    def write(module, args, out):  # after its module ran: the output is unchanged, the module is not
        OPS["write"](module)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).double().eval()
    model[1].register_forward_hook(write)
    x = torch.randn(3, 4, dtype=torch.float64)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        OPS["write"] = writers["buffer"]
        with pytest.warns(ToolkitWarning, match="could not be read to the end"):
            Explainer(model, "gradient").attribute(x, target=0)
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
        OPS["write"] = writers["weight"]
        with pytest.warns(ToolkitWarning), pytest.raises(AttributionError, match=r"wrote into its parameters 1\.weight"):
            Explainer(model, "gradient").attribute(x, target=0)
    finally:
        OPS.clear()


def test_a_model_that_fails_with_its_hooks_is_said_not_refused():
    def call_back(module, args, out):
        OPS.get("callback")(out)  # none registered: the forward fails with this hook

    model, x = _model(call_back), torch.randn(2, 4, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        maps = Explainer(model, "gradient").attribute(x, target=1)
    unread, failed = [str(w.message) for w in said if issubclass(w.category, ToolkitWarning)]
    assert "could not be read to the end" in unread
    assert re.search(r"own forward fails with its hooks \(0: forward hook .*call_back\).*TypeError.*was not checked",
                     failed)
    torch.testing.assert_close(maps, Explainer(_model(), "gradient").attribute(x, target=1), rtol=0, atol=0)


def test_differences_within_the_dtypes_rounding_pass_and_beyond_it_are_refused():
    model, x = _model(lambda module, args, out: None), torch.randn(3, 4, dtype=torch.float64)
    logits = torch.tensor([[10.0, -3.0], [0.5, 2.0]], dtype=torch.float64)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        tolerance = rounding(dtype)
        base = logits.to(dtype)
        check_hooked_forward(model, lambda _: base * (1 + tolerance / 4), lambda _: base, x)  # rounding: passes
        with pytest.raises(AttributionError, match=f"beyond the {tolerance:.1e} that {str(dtype)[6:]} rounding"):
            check_hooked_forward(model, lambda _: base + 4 * tolerance * 10, lambda _: base, x)
    nan = torch.tensor([[float("nan"), 1.0]], dtype=torch.float64)
    check_hooked_forward(model, lambda _: nan, lambda _: nan.clone(), x)  # NaN where both are NaN: the same
    with pytest.raises(AttributionError, match="differ by up to inf"):
        check_hooked_forward(model, lambda _: nan, lambda _: torch.ones_like(nan), x)
    unhooked = _model()
    check_hooked_forward(unhooked, lambda _: logits, lambda _: logits + 1, x)  # no hooks: nothing run, nothing compared


@pytest.mark.parametrize("hook", FORMS, ids=lambda h: h.__name__)
def test_every_form_is_refused_through_an_audit_check(hook):
    from audit.checks.random_logit import random_logit_test

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 6 * 6, 3)).eval()
    model[0].register_forward_hook(hook)
    x, y = torch.rand(2, 1, 8, 8), torch.tensor([0, 2])
    with warnings.catch_warnings(), pytest.raises(ToolkitError, match=f"0: forward hook {hook.__qualname__}"):
        warnings.simplefilter("ignore", ToolkitWarning)
        random_logit_test(model, x, y, "gradient", progress=False)
