"""Randomization stages: every parameter in exactly one stage, blocks from the module tree, forward order."""
import pytest
import torch
from torch import nn

from attributions.graph import trace
from audit.checks.stages import blocks, parts, randomization_plan, resolve_granularity
from audit.errors import ConfigError
from audit.models import load_checkpoint
from tests.engine_zoo import zoo_model

X28 = torch.rand(2, 1, 28, 28)


def _models():
    return {"cnn-sgd": (load_checkpoint("cnn-sgd"), X28), "resnet-sgd": (load_checkpoint("resnet-sgd"), X28),
            "vit-sgd": (load_checkpoint("vit-sgd"), X28),
            "convnext": (zoo_model("convnext"), torch.rand(2, 1, 32, 32, dtype=torch.float64)),
            "vit_mha": (zoo_model("vit_mha"), torch.rand(2, 1, 8, 8, dtype=torch.float64))}


@pytest.mark.parametrize("name", list(_models()))
@pytest.mark.parametrize("granularity", ["layer", "block"])
def test_every_parameter_is_in_exactly_one_stage(name, granularity):
    model, x = _models()[name]
    plan = randomization_plan(model, trace(model, x), granularity)
    tensors = [t for stage in plan for t in stage.tensors]
    assert sorted(tensors) == sorted(n for n, _ in model.named_parameters())
    assert len({s.name for s in plan}) == len(plan)


def test_blocks_are_the_members_of_the_model_sequences():
    models = _models()
    assert blocks(models["cnn-sgd"][0]) == []  # a stack of layers: no blocks
    assert blocks(models["resnet-sgd"][0]) == [f"layer{i}.{j}" for i in (1, 2, 3) for j in range(3)]
    assert blocks(models["vit-sgd"][0]) == [f"blocks.{i}" for i in range(4)]
    assert blocks(models["convnext"][0]) == ["blocks.0", "blocks.1"]
    assert resolve_granularity(models["cnn-sgd"][0], "auto") == "layer"
    assert resolve_granularity(models["vit-sgd"][0], "auto") == "block"
    with pytest.raises(ConfigError, match="stage granularity"):
        resolve_granularity(models["cnn-sgd"][0], "neuron")


def test_stages_in_forward_order_with_tokens_and_layer_scales_where_their_module_is():
    model, x = _models()["vit-sgd"]
    plan = randomization_plan(model, trace(model, x), "block")
    assert [s.name for s in plan] == ["patch", "cls", "pos", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm",
                                      "head"]
    assert set(plan[3].tensors) == {n for n, _ in model.named_parameters() if n.startswith("blocks.0.")}
    convnext, x = _models()["convnext"]
    plan = randomization_plan(convnext, trace(convnext, x), "block")
    assert [s.name for s in plan] == ["stem", "norm", "blocks.0", "blocks.1", "head"]
    assert "blocks.1.gamma" in plan[3].tensors  # a layer scale: with the block that holds it
    layer = randomization_plan(convnext, trace(convnext, x), "layer")
    assert [s.name for s in layer][:7] == ["stem", "norm", "blocks.0.dw", "blocks.0.norm", "blocks.0.up",
                                           "blocks.0.down", "blocks.0.gamma"]


def test_layer_stages_are_the_weighted_layers_with_their_folded_batchnorm():
    # the stages of earlier versions: one per conv / dense / BatchNorm module, a folded BatchNorm with its conv
    for name in ("cnn-sgd", "resnet-sgd"):
        model, x = _models()[name]
        graph = trace(model, x)
        plan = randomization_plan(model, graph, "layer")
        weighted = graph.weighted_layers()
        assert [s.name for s in plan] == [n for n, _, _ in weighted]
        paths = {m: n for n, m in model.named_modules()}
        for stage, (_, module, bn) in zip(plan, weighted):
            expected = [p for p in module.parameters(recurse=False)] + ([*bn.parameters()] if bn is not None else [])
            assert [model.get_parameter(t) for t in stage.tensors] == expected
            assert [p.batchnorm for p in stage.parts] == [False] + ([True] if bn is not None else [])
            if bn is not None:
                assert stage.parts[1].path == paths[bn]


def test_a_tensor_forward_never_reads_still_has_a_stage():
    class WithUnused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 3), nn.Linear(4, 3)
            self.scale = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.used(x) * self.scale

    model = WithUnused().eval()
    found = parts(model, trace(model, torch.rand(2, 4)))
    assert [p.path for p in found] == ["used", "scale", "unused"]  # never read: last
    assert found[1].holder == "" and found[1].tensors == ("scale",)


def test_a_wrapped_model_and_a_backbone_of_conv_layers_have_their_members_as_blocks():
    class Wrapped(nn.Module):  # a wrapper holding the model (a Hugging Face model behind .logits, say)
        def __init__(self, model: nn.Module):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x)

    resnet = load_checkpoint("resnet-sgd")
    assert blocks(Wrapped(resnet)) == [f"model.{b}" for b in blocks(resnet)]

    class ConvBN(nn.Module):
        def __init__(self, c_in: int, c_out: int):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out)

    class Backbone(nn.Module):  # MobileNet V1 as Hugging Face writes it: a stem and a list of conv-norm layers
        def __init__(self):
            super().__init__()
            self.stem = ConvBN(1, 4)
            self.layer = nn.ModuleList([ConvBN(4, 4) for _ in range(3)])

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.head = Backbone(), nn.Linear(4, 3)

    assert blocks(Classifier()) == ["backbone.stem", "backbone.layer.0", "backbone.layer.1", "backbone.layer.2"]
