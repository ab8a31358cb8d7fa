"""How attribution maps are computed (traced graph, rules, methods, captum bridge)."""
