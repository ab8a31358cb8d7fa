"""How attribution maps are computed: traced graph, rules, methods, captum bridge."""
from typing import TYPE_CHECKING

from attributions.lazy import exports

if TYPE_CHECKING:
    from attributions import rules
    from attributions.errors import AttributionError, ToolkitError
    from attributions.explainer import Explainer
    from attributions.methods import Method, available_methods, build_method

__all__ = ["AttributionError", "Explainer", "Method", "ToolkitError", "available_methods", "build_method", "rules"]
__getattr__, __dir__ = exports(__name__, {"AttributionError": "attributions.errors", "ToolkitError": "attributions.errors",
                                          "Explainer": "attributions.explainer", "Method": "attributions.methods",
                                          "available_methods": "attributions.methods",
                                          "build_method": "attributions.methods"})
