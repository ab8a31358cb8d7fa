"""The model zoo: shapes, options, parameter counts, torchvision state_dict keys, checkpoints."""
import json
import operator

import pytest
import torch
from torch import nn

from audit.errors import ConfigError, ModelError
from audit.models import ARCHS, build, load_checkpoint, save_checkpoint

SMALL = ["cnn", "vgg", "resnet"]


def _weights(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("in_shape", [(1, 28, 28), (3, 32, 32)])
def test_small_models_forward(name, in_shape):
    torch.manual_seed(0)
    model = build(name, in_shape, num_classes=7)
    assert model(torch.rand(2, *in_shape)).shape == (2, 7)


def test_vgg_batchnorm_option():
    plain, bn = build("vgg"), build("vgg", batch_norm=True)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    assert sum(isinstance(m, nn.BatchNorm2d) for m in bn.modules()) == 8
    assert sum(isinstance(m, nn.Conv2d) for m in bn.modules()) == 8


def test_layers_are_wide_where_the_input_allows():
    """Bort can make rows orthogonal only where out <= in * k * k."""
    tall = {}
    for name in SMALL:
        tall[name] = [n for n, m in _weights(build(name)) if m.weight.shape[0] > m.weight[0].numel()]
    assert tall["cnn"] == []
    assert tall["vgg"] == ["features.0"]  # 3x3 conv on one input channel: 16 > 9
    assert tall["resnet"] == ["conv1", "layer2.0.downsample.0", "layer3.0.downsample.0"]


def test_resnet_residual_add_is_visible_to_a_tracer():
    graph = torch.fx.symbolic_trace(build("resnet")).graph
    adds = [n for n in graph.nodes if n.op == "call_function" and n.target in (operator.add, torch.add)]
    assert len(adds) == 9


def test_imagenet_models_match_torchvision_layout():
    r50 = build("resnet50", (3, 224, 224), 1000)
    assert sum(p.numel() for p in r50.parameters()) == 25_557_032
    keys = r50.state_dict().keys()
    for k in ("conv1.weight", "bn1.running_var", "layer1.0.downsample.0.weight", "layer4.2.bn3.num_batches_tracked",
              "layer3.5.conv2.weight", "fc.bias"):
        assert k in keys
    assert r50.state_dict()["layer2.0.conv2.weight"].shape == (128, 128, 3, 3)
    assert r50(torch.rand(1, 3, 64, 64)).shape == (1, 1000)
    del r50
    vgg = build("vgg16", (3, 224, 224), 1000)
    assert sum(p.numel() for p in vgg.parameters()) == 138_357_544
    convs = [int(k.split(".")[1]) for k in vgg.state_dict() if k.startswith("features") and k.endswith("weight")]
    assert convs == [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28]
    assert vgg.state_dict()["classifier.6.weight"].shape == (1000, 4096)


def test_bad_arch_and_shapes():
    with pytest.raises(ModelError, match="valid: cnn, resnet, resnet50, vgg, vgg16"):
        build("vgg19")
    with pytest.raises(ModelError, match="at least 8x8"):
        build("cnn", (1, 6, 6))
    with pytest.raises(ModelError, match="at least 32x32"):
        build("resnet50", (3, 28, 28))
    for bad in [(28, 28), (1, 28, 28, 1), (0, 28, 28), "abc", (1.5, 28, 28)]:
        with pytest.raises(ModelError, match="in_shape"):
            build("cnn", bad)
    with pytest.raises(ModelError, match="no option batchnorm"):
        build("vgg", batchnorm=True)
    assert set(ARCHS) == {"cnn", "vgg", "resnet", "vgg16", "resnet50", "vit"}


def _meta(arch="cnn", **extra):
    return {"arch": arch, "in_shape": [1, 28, 28], "num_classes": 10, "arch_options": {}, **extra}


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(1)
    model = build("resnet").train()
    with torch.no_grad():
        model(torch.rand(8, 1, 28, 28))  # moves BatchNorm running stats away from their init
    model.eval()
    path = save_checkpoint(model, _meta("resnet", test_accuracy=0.5), tmp_path / "m.pt")
    loaded = load_checkpoint(path)
    assert not loaded.training and loaded.metadata["test_accuracy"] == 0.5
    x = torch.rand(3, 1, 28, 28)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert load_checkpoint(tmp_path / "m").metadata["arch"] == "resnet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.pt"]  # no temp files left


def test_checkpoint_metadata_must_match_weights(tmp_path):
    save_checkpoint(build("cnn"), _meta(), tmp_path / "m.pt")
    meta = json.loads((tmp_path / "m.json").read_text())
    (tmp_path / "m.json").write_text(json.dumps({**meta, "num_classes": 5}))
    with pytest.raises(ModelError, match="do not match the metadata"):
        load_checkpoint(tmp_path / "m.pt")
    (tmp_path / "m.json").write_text(json.dumps({**meta, "arch": "vgg"}))
    with pytest.raises(ModelError, match="do not match"):
        load_checkpoint(tmp_path / "m.pt")
    (tmp_path / "m.json").write_text("{not json")
    with pytest.raises(ModelError, match="metadata must be JSON"):
        load_checkpoint(tmp_path / "m.pt")
    (tmp_path / "m.json").unlink()
    with pytest.raises(ModelError, match="m.json not found"):
        load_checkpoint(tmp_path / "m.pt")


def test_unknown_checkpoint_name():
    with pytest.raises(ModelError, match="unknown checkpoint"):
        load_checkpoint("no-such-model")
    assert not issubclass(ModelError, ConfigError)
