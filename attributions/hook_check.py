"""The model's own forward, its hooks run, against the graph captured from its modules' code.

The engine explains ``model(x)`` as its modules compute it and never runs hooks. Reading the hooks' code
(:mod:`attributions.hooks`) refuses a hook that it sees change the output and warns of one whose code it cannot
follow; this check does not depend on reading code. Where the model has forward hooks or pre-hooks (its modules'
or the global ones), each capture runs the model's own forward once on the capture's input (at most
:data:`CHECKED_IMAGES` images where the graph serves any batch), hooks and all, and compares its logits with the
captured graph's on the same input: a difference beyond rounding is an :class:`~attributions.errors.AttributionError`
naming every hook on the model. A model without such hooks is not run: its graph is its modules' code.

The forward runs as capture sees the model: in eval mode, under ``torch.no_grad``, from the random state the graph
then runs from, and the model is left as it was (training flags, buffers, the random generators). A hook does run
once more than the caller ran it: an observer stores one more activation. A hook that writes into a parameter is
refused (its value cannot be restored: the parameters are not copied, which would double the model's memory).
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import nn

from attributions.errors import AttributionError, ToolkitWarning
from attributions.hooks import registered_hooks

CHECKED_IMAGES = 4  # images the check runs where the graph serves any batch: the model runs once more on them


def rounding(dtype: torch.dtype) -> float:
    """The largest difference, relative to the largest logit, that two computations of the same logits in ``dtype``
    (the model's own kernels and the captured graph's, blocked or fused otherwise) are taken to differ by:
    the square root of its machine epsilon (1.5e-8 in float64, 3.5e-4 in float32, 3e-2 in float16)."""
    return float(torch.finfo(dtype).eps) ** 0.5 if dtype.is_floating_point else 0.0


def check_hooked_forward(model: nn.Module, own: Callable[[torch.Tensor], torch.Tensor],
                         graph: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """Refuse ``model`` where its own forward, hooks and all, gives other logits than the captured graph.

    Parameters
    ----------
    model : nn.Module
        The model captured; nothing is run where it has no forward hook or pre-hook.
    own : callable
        ``x`` (B, ...) -> the logits (B, classes) of the model's own forward (its hooks run).
    graph : callable
        ``x`` (B, ...) -> the logits (B, classes) of the captured graph, read from the live model.
    x : torch.Tensor
        (B, ...) the inputs compared on.

    Raises
    ------
    AttributionError
        Where the logits differ beyond :func:`rounding` (or in shape), naming the model's hooks; where a hook
        wrote into a parameter.
    """
    hooks = registered_hooks(model)
    if not hooks:
        return
    try:
        with _as_it_was(model, x.device, hooks), torch.no_grad():
            mine = own(x)
    except AttributionError:
        raise
    except Exception as exc:  # the model does not run with its hooks: nothing to compare, said
        warnings.warn(f"the model's own forward fails with its hooks ({'; '.join(hooks)}) on inputs of shape "
                      f"{tuple(x.shape)} ({type(exc).__name__}: {exc}); whether they change what it computes was not "
                      "checked: the maps explain the model as its modules compute it, without its hooks",
                      ToolkitWarning, stacklevel=4)
        return
    with _same_draws(x.device), torch.no_grad():
        captured = graph(x)
    _compare(mine, captured, hooks)


def _compare(mine: torch.Tensor, captured: torch.Tensor, hooks: list[str]) -> None:
    """An :class:`AttributionError` where the model's own logits ``mine`` and the graph's ``captured`` (B, classes)
    differ beyond rounding (values equal or NaN in both count as equal)."""
    fix = ("the maps explain model(x) as its modules compute it, without its hooks: remove the hook that changes the "
           "output (handle.remove()) or move what it does into a module's forward")
    if mine.shape != captured.shape:
        raise AttributionError(f"the model's own forward, its hooks run, returns logits of shape {tuple(mine.shape)}, "
                               f"its captured graph {tuple(captured.shape)}: a hook changes what the model computes "
                               f"(hooks on the model: {'; '.join(hooks)}); {fix}")
    # the narrower of the two dtypes rounds the more; compared in float64
    dtype = min(mine.dtype, captured.dtype, key=lambda d: torch.finfo(d).bits if d.is_floating_point else 64)
    tolerance = rounding(dtype if dtype.is_floating_point else torch.float64)
    mine, captured = mine.double(), captured.double()
    same = (mine == captured) | mine.isnan() & captured.isnan()
    gap = float(torch.where(same, 0.0, (mine - captured).abs()).nan_to_num(torch.inf).max()) if mine.numel() else 0.0
    scale = float(mine.abs().nan_to_num(0.0, 0.0, 0.0).max()) if mine.numel() else 0.0
    allowed = max(tolerance * scale, torch.finfo(torch.float32).tiny)
    if gap > allowed:
        raise AttributionError(f"the model's own forward, its hooks run, gives other logits than its modules' code as "
                               f"the engine captured it: they differ by up to {gap:.3g} ({gap / max(scale, 1e-300):.2g} "
                               f"of the largest logit, beyond the {tolerance:.1e} that {str(dtype)[6:]} rounding allows) on "
                               f"{len(mine)} inputs, so a hook changes what the model computes in a way its code does "
                               f"not show (hooks on the model: {'; '.join(hooks)}); {fix}")


@contextlib.contextmanager
def _same_draws(device: torch.device) -> Iterator[None]:
    """The random generators (the CPU's, and ``device``'s where it is a GPU) restored after the body: the model's
    forward and the graph draw the same numbers, and the caller's next draws are those it would have made."""
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


@contextlib.contextmanager
def _as_it_was(model: nn.Module, device: torch.device, hooks: list[str]) -> Iterator[None]:
    """``model`` in eval mode for the body, then as it was: training flags, buffers (values and objects), random
    generators. A parameter written in place by the body cannot be restored: an :class:`AttributionError`."""
    modules = dict(model.named_modules(remove_duplicate=False))
    flags = {path: m.training for path, m in modules.items()}
    buffers = [(m, name, b, b._version, b.detach().clone()) for m in modules.values() for name, b in m._buffers.items()
               if b is not None]
    parameters = [(f"{path}.{name}" if path else name, m, name, p, p._version) for path, m in modules.items()
                  for name, p in m._parameters.items() if p is not None]
    try:
        with _same_draws(device):
            for m in modules.values():
                m.training = False
            yield
    finally:
        for path, m in modules.items():
            m.training = flags[path]
        with torch.no_grad():
            for m, name, b, version, value in buffers:
                m._buffers[name] = b
                if b._version != version:
                    b.copy_(value)
        for _, m, name, p, _ in parameters:
            m._parameters[name] = p
    written = list(dict.fromkeys(path for path, _, _, p, version in parameters if p._version != version))
    if written:
        raise AttributionError(f"a hook of the model wrote into its parameters {', '.join(written)} when the engine ran "
                               "the model's own forward to compare it with its captured graph (hooks on the model: "
                               f"{'; '.join(hooks)}): they are changed, as each time the model runs; remove the hook "
                               "(handle.remove()) or move what it does into a module's forward, and reload the model")
