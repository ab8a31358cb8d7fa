"""Sphinx configuration of the documentation site (``make docs``; built with warnings as errors)."""
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]
os.environ.setdefault("MPLBACKEND", "Agg")

import generate  # noqa: E402  (needs the repository on the path)

generate.write_all(HERE / "_generated")

project = "attribution-audit"
author = "the attribution-audit authors"
copyright = "2026, the attribution-audit authors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax", "sphinxcontrib.bibtex"]
exclude_patterns = ["_build", "_generated/*.md", "benchmarks/*.md", "sweep/*.md", "README.md", "**.ipynb_checkpoints"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # the notebooks are committed with their outputs (make notebooks runs them)
bibtex_bibfiles = ["_generated/references.bib"]
bibtex_reference_style = "author_year"
bibtex_default_style = "plain"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True  # a dataclass's Attributes as a field list: its fields are not documented twice
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
# the docstrings' informal types ("str, name of the node") are cross-referenced word by word by Sphinx; a word that
# names several attributes ("name", "inputs") is ambiguous, not broken
suppress_warnings = ["ref.python"]
html_theme = "furo"
html_title = "attribution-audit"
