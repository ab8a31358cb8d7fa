"""The shared forward pass of the map-based checks: explainers kept across in-place model changes."""
import copy

import torch

from attributions.explainer import attribute_many
from audit.checks.passes import prepare
from audit.checks.randomization import reinitialise


def test_prepare_keeps_the_explainers_of_the_same_model_and_graph_and_their_maps_follow_its_weights(trained):
    model, x, y = trained
    model = copy.deepcopy(model)
    graph, first, _, _ = prepare(model, x, ["gradient", "random"], y, seed=0)
    reinitialise(model.classifier[2], "classifier.2", seed=1)  # in place, as a randomization stage does
    _, kept, envs, _ = prepare(model, x, ["gradient", "random"], graph=graph, seed=1, previous=first)
    assert kept["gradient"] is first["gradient"]
    assert kept["random"] is not first["random"]  # its seed is given anew: rebuilt
    _, fresh, fresh_envs, _ = prepare(model, x, ["gradient"], graph=graph)
    maps = attribute_many({"gradient": kept["gradient"]}, x, [y], envs)["gradient"]
    torch.testing.assert_close(maps, attribute_many(fresh, x, [y], fresh_envs)["gradient"], rtol=0, atol=0)
    other = copy.deepcopy(model)
    _, elsewhere, _, _ = prepare(other, x, ["gradient"], previous=first)
    assert elsewhere["gradient"] is not first["gradient"]  # another model: never reused


def test_the_methods_parameters_reach_every_explainer_by_argument(trained):
    from audit.checks.passes import explainer
    from audit.checks.random_logit import random_logit_test

    model, x, y = trained
    params = {"lrp-epsilon": {"epsilon": 0.5}}
    _, built, _, _ = prepare(model, x, ["lrp-epsilon", "gradient"], y, params=params)
    def epsilon(ex):
        return repr(ex.method.rules["conv"])

    assert epsilon(built["lrp-epsilon"]) == "Epsilon(epsilon=0.5)" and "gradient" in built
    assert epsilon(explainer(model, "lrp-epsilon", params=params)) == "Epsilon(epsilon=0.5)"
    assert epsilon(explainer(model, "lrp-epsilon")) != "Epsilon(epsilon=0.5)"  # nothing held between calls
    given = random_logit_test(model, x, y, ["lrp-epsilon"], progress=False, params=params)
    plain = random_logit_test(model, x, y, ["lrp-epsilon"], progress=False)
    again = random_logit_test(model, x, y, ["lrp-epsilon"], progress=False, params={"lrp-epsilon": {"epsilon": 0.5}})
    assert given.equals(again) and not given.equals(plain)
