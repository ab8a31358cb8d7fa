"""How attribution maps are computed: traced graph, rules, methods, captum bridge."""
from attributions import rules
from attributions.errors import AttributionError, ToolkitError
from attributions.explainer import Explainer
from attributions.methods import Method, available_methods, build_method

__all__ = ["AttributionError", "Explainer", "Method", "ToolkitError", "available_methods", "build_method", "rules"]
