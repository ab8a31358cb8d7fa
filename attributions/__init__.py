"""How attribution maps are computed: traced graph, rules, methods, captum bridge."""
from attributions.explainer import Explainer
from attributions.methods import available_methods, build_method

__all__ = ["Explainer", "available_methods", "build_method"]
