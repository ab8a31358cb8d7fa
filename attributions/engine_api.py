"""The engine's declared interface to the layers above it: every name that ``bort``, ``audit`` and ``reports``
import from ``attributions``, by module.

The layering test (``tests/test_layers.py``) parses every import of those packages and fails on a name not
declared here, so a new dependency on the engine's insides is a decision made in this file, not an accident
of a refactoring. The engine's other names may change without the layers above noticing.
"""
from __future__ import annotations

ENGINE_API: dict[str, frozenset[str]] = {
    "attributions": frozenset({"capture_cache", "memory"}),  # the capture cache's and the memory budget's modules
    "attributions.capture": frozenset({"logits_of"}),
    "attributions.catalog": frozenset({"ABOUT", "ATTENTION", "CONTROLS", "FAMILIES", "by_family", "family", "members"}),
    "attributions.controls": frozenset({"sobel_magnitude"}),
    "attributions.errors": frozenset({"AttributionError", "NotApplicable", "ToolkitError", "ToolkitWarning",
                                       "unknown_name"}),
    "attributions.explainer": frozenset({"Explainer", "ForwardPass", "Reuse", "attribute_many", "check_input",
                                         "model_dtype", "shared_forward"}),
    "attributions.graph": frozenset({"Graph", "Node", "trace"}),
    "attributions.hook_check": frozenset({"CHECKED_IMAGES"}),
    "attributions.hooks": frozenset({"refuse_changing_hooks", "registered_hooks", "unresolved_hooks"}),
    "attributions.hygiene": frozenset({"leaves_process_alone", "untouched"}),
    "attributions.kinds": frozenset({"ELEMENTWISE_KINDS", "RECORDED_KINDS", "SIGNAL_KINDS", "Kind"}),
    "attributions.lazy": frozenset({"exports"}),
    "attributions.linear_ops": frozenset({"explicit_padding"}),
    "attributions.methods": frozenset({"BUILDERS", "build_method", "takes_baseline"}),
    "attributions.patterns": frozenset({"fingerprint"}),
    "attributions.records": frozenset({"Const", "Move", "Norm"}),
    "attributions.shared_pass": frozenset({"SharedPass"}),
    "attributions.validation": frozenset({"named", "nonfinite_tensors"}),
}
