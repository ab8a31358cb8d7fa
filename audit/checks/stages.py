"""What each parameter randomization stage re-initialises.

Every parameter tensor of the model belongs to exactly one *part*: the tensors one initialiser
draws together. A part is the parameters of a weighted layer (a conv / linear / BatchNorm module,
or a module holding only parameters of its own, such as a LayerNorm), or one tensor a module uses
directly in ``forward`` beside its submodules (a class token, a position embedding, a layer scale,
a relative position bias table). Parts are grouped into *stages*:

* ``layer``: one weighted layer per stage (a BatchNorm folded after a conv / linear layer goes with
  it), each other part a stage of its own;
* ``block``: the model's own blocks (a ResNet's bottlenecks, a ViT's encoder blocks: the members of
  a sequence of modules in the module tree), each part outside every block a stage of its own (a
  stem convolution, the head, the class token).

Stages are in forward order: the order in which the traced graph first reads their tensors
(tensors ``forward`` never reads come last, in the module tree's order).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from attributions.graph import Graph
from audit.inputs import check_finite_model, check_option

GRANULARITIES = ("auto", "layer", "block")
CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


@dataclass(frozen=True)
class Part:
    """Tensors re-initialised together: ``tensors`` (their names in the model), held by the module
    at ``holder``; ``path`` names the part (the holder, or the tensor's own name for a tensor the
    holder uses directly in forward) and seeds its draw; ``batchnorm``: a BatchNorm's, which the
    BatchNorm policy governs; ``group``: the layer stage it joins (a folded BatchNorm joins its conv)."""

    path: str
    holder: str
    tensors: tuple[str, ...]
    batchnorm: bool = False
    group: str = ""


@dataclass(frozen=True)
class Stage:
    """One randomization stage: its ``name`` (a layer's or block's module path, or a tensor's name)
    and the ``parts`` it re-initialises."""

    name: str
    parts: tuple[Part, ...]

    @property
    def tensors(self) -> tuple[str, ...]:
        return tuple(t for p in self.parts for t in p.tensors)

    @property
    def paths(self) -> set[str]:
        """The module paths and tensor names whose values the stage changes (for the graph's nodes)."""
        return {p.path for p in self.parts}


def _holds(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _is_layer(module: nn.Module) -> bool:
    """A module none of whose submodules holds parameters."""
    return not any(_holds(c) for c in module.children())


def _is_composite(module: nn.Module) -> bool:
    """A module with a submodule that is not a layer (a bottleneck with its downsampling branch)."""
    return any(_holds(c) and not _is_layer(c) for c in module.children())


def _has_sequence(module: nn.Module) -> bool:
    """Whether ``module`` is, or holds at any depth, a sequence of blocks: a container with a
    composite member (a sequence of conv-norm-activation triples is not one: they are its blocks)."""
    if isinstance(module, CONTAINERS) and any(_is_composite(c) for c in module.children()):
        return True
    return any(_has_sequence(c) for c in module.children() if not _is_layer(c))


def _trunk(module: nn.Module) -> nn.Module | None:
    """The one submodule of ``module`` that holds parameters and is not a layer, where there is only
    one and ``module`` holds no tensors of its own (a wrapper, or a classifier around a backbone)."""
    found = [c for c in module.children() if _holds(c) and not _is_layer(c)]
    own = next(module.parameters(recurse=False), None) is not None
    return found[0] if len(found) == 1 and not own else None


def blocks(model: nn.Module) -> list[str]:
    """The module paths of ``model``'s blocks, in the module tree's order: the members of a
    sequence of modules (``nn.Sequential``, ``nn.ModuleList``, ``nn.ModuleDict``) that are not layers
    and hold no deeper sequence, and the modules made of layers that a model or a block-free module
    holds as named attributes (Inception's ``Mixed_5b``). Outside a sequence, a module with parameters
    of its own beside its submodules is not a block (its own tensors stand alone: a ViT's class
    token), nor is the one non-layer module of its parent (a wrapped model's trunk: its members are)."""
    out: list[str] = []

    def visit(path: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            where = f"{path}.{name}" if path else name
            if not _holds(child) or _is_layer(child):
                continue
            if _has_sequence(child):
                visit(where, child)
            elif isinstance(module, CONTAINERS):
                out.append(where)
            elif isinstance(child, CONTAINERS) or next(child.parameters(recurse=False), None) is not None \
                    or _trunk(module) is child:
                # a sequence of layers, a module with tensors of its own, or the one module beside a head
                # (a wrapped model, a library's backbone): not one block
                visit(where, child)
            else:
                out.append(where)

    visit("", model)
    return out


def parts(model: nn.Module, graph: Graph) -> list[Part]:
    """Every parameter of ``model`` in exactly one part, in forward order (``graph``: the model traced).

    The weighted layers come as the graph names them (the module each conv / linear / BatchNorm op
    reads its weight from, a BatchNorm folded after it as its own part in the same group); every
    other tensor goes with its module when that module is a layer, else stands alone.
    """
    names = {id(p): n for n, p in model.named_parameters()}  # a tensor shared by two modules: once
    uses = graph.parameter_uses()
    out: list[Part] = []
    taken: set[str] = set()

    def own(path: str, module: nn.Module) -> tuple[str, ...]:
        return tuple(names[id(p)] for p in module.parameters(recurse=False)
                     if id(p) in names and names[id(p)] not in taken)

    def add(path: str, module: nn.Module, tensors: tuple[str, ...], group: str) -> None:
        if tensors:
            out.append(Part(path, path, tensors, isinstance(module, _BatchNorm), group))
            taken.update(tensors)

    paths = {id(m): n for n, m in model.named_modules()}
    for path, module, bn in graph.weighted_layers():
        add(path, module, own(path, module), path)
        if bn is not None:
            bn_path = paths[id(bn)]
            add(bn_path, bn, own(bn_path, bn), path)
    for path, module in model.named_modules():
        tensors = own(path, module)
        if not tensors:
            continue
        if _is_layer(module) and path:
            add(path, module, tensors, path)
        else:
            for t in tensors:
                out.append(Part(t, path, (t,), False, t))
                taken.add(t)
    last = len(graph.nodes)
    rank = {n: k for k, n in enumerate(names.values())}

    def position(part: Part) -> tuple[int, int]:
        # where the graph first reads the part's tensors (a tie keeps the weighted layers' order);
        # tensors it never reads last, in the module tree's order
        first = min(uses.get(t, last) for t in part.tensors)
        return first, min(rank[t] for t in part.tensors) if first == last else 0

    return sorted(out, key=position)


def resolve_granularity(model: nn.Module, granularity: str) -> str:
    """``granularity`` with ``auto`` resolved: ``block`` for a model with blocks, else ``layer``."""
    check_option("stage granularity", granularity, GRANULARITIES)
    if granularity == "auto":
        return "block" if blocks(model) else "layer"
    return granularity


def randomization_plan(model: nn.Module, graph: Graph, granularity: str = "auto") -> list[Stage]:
    """The stages of ``model`` (traced as ``graph``) at ``granularity`` (``layer``, ``block`` or ``auto``), in
    forward order; together they hold every parameter tensor once.

    Parameters
    ----------
    model : nn.Module
        The model whose parameters the stages re-initialise; only read.
    graph : Graph
        ``model`` traced (:func:`attributions.graph.trace`): it names the weighted layers and the
        BatchNorms folded after them (which join their layer's stage), and gives the order in which the
        tensors are first read.
    granularity : str, default "auto"
        ``layer`` (one weighted layer per stage), ``block`` (the model's own blocks, :func:`blocks`) or
        ``auto`` (``block`` when the model has blocks, else ``layer``); see the module docstring.

    Returns
    -------
    list of Stage
        In forward order (tensors the forward pass never reads last); each stage is named by its
        layer's or block's module path, or by a tensor's name for a tensor standing alone.

    Raises
    ------
    ConfigError
        For an unknown ``granularity``.
    """
    check_finite_model(model)  # what an audit of it would refuse, refused here too
    granularity = resolve_granularity(model, granularity)
    found = blocks(model) if granularity == "block" else []

    def key(part: Part) -> str:
        for b in found:
            if part.path == b or part.path.startswith(b + "."):
                return b
        return part.group or part.path

    grouped: dict[str, list[Part]] = {}
    for part in parts(model, graph):  # in forward order: a stage is where its first part is read
        grouped.setdefault(key(part), []).append(part)
    return [Stage(name, tuple(members)) for name, members in grouped.items()]
