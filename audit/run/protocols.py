"""The source papers' protocols as settings of the checks: ``--protocol adebayo2018`` or ``sixt2020`` sets what
each paper did where the toolkit has an option for it, and says what still differs.

A protocol fills the checks' options the user did not set (an explicit option wins, and the report then names
the difference); the toolkit's own defaults (``--protocol toolkit``) stay as they are. The run's manifest
records the protocol with every option, and the report's reproduction tables state the protocol each used.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Protocol:
    """A paper's protocol, as option values and the differences that remain.

    Attributes
    ----------
    name : the ``--protocol`` value
    source : the paper, in words
    settings : {check option: value} the protocol sets where the user did not
    remaining : what still differs from the paper under these settings, in words
    """

    name: str
    source: str
    settings: dict[str, Any] = field(default_factory=dict)
    remaining: tuple[str, ...] = ()


PROTOCOLS = {p.name: p for p in (
    Protocol("toolkit", "the toolkit's defaults: the true label explained, BatchNorm reset at a randomized stage (as "
             "Sixt et al.), each module's own re-initialisation (as Quantus)"),
    # Adebayo et al. 2018, section 4: the randomized model's predicted class is explained; the BatchNorm statistics
    # stay (only the trainable variables are re-initialised, by their own initializers: a truncated normal for
    # Inception v3's convolutions). Section 5 explains the true label on the model and its twin.
    # Their measures (audit.measures.measure_sets): SSIM of the signed maps scaled to [-1, 1], 5 x 5 window, data range
    # 2 (the first author's answer in the code's issue 2); HOG by Spearman, as the released notebooks compute it.
    Protocol("adebayo2018", "Adebayo et al. (2018)", {"target": "predicted", "bn": "keep-stats", "init": "gaussian",
                                                      "data_target": "true", "measures": "adebayo2018"},
             ("HOG cells of a quarter of the map's side in 2 x 2 blocks (the paper's code: 16-pixel cells in 3 x 3 "
              "blocks on 299-pixel ImageNet maps, which a 28-pixel map cannot hold)",
              "the models and data: the paper's Inception v3 on ImageNet and CNN / MLP on MNIST")),
    # Sixt et al. 2020, section 3.1: five Gaussian vectors, a collapse at median |cos| 0.99; the random logit and
    # cascading randomization with the true label and BatchNorm reset.
    Protocol("sixt2020", "Sixt et al. (2020)", {"n_vectors": 5, "csc_threshold": 0.99, "target": "true", "bn": "reset"},
             ("the models and data: the paper's VGG-16 and ResNet-50 on ImageNet",
              "CSC at the input read at the recorded layer nearest the input (the paper: conv1_1)")),
)}


def protocol_options(name: str, explicit: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The checks' options under protocol ``name``: the user's ``explicit`` values, else the protocol's, else the
    ``defaults``."""
    settings = PROTOCOLS[name].settings
    return {key: explicit[key] if key in explicit else settings.get(key, default) for key, default in defaults.items()}


def overridden(name: str, options: dict[str, Any]) -> list[str]:
    """The protocol's settings the run's ``options`` do not follow (an explicit option won), as "key=value (the
    protocol: value)" texts."""
    return [f"{key}={options[key]} (the protocol: {value})" for key, value in PROTOCOLS[name].settings.items()
            if key in options and options[key] != value]
