"""Sphinx configuration of sac's documentation site (bash .ci/docs builds it).

Pages are Markdown (MyST). The C++ reference comes from the public headers
through Doxygen's XML and Breathe; the Python reference from the installed
torch_sac package's docstrings."""
import os

project = "sac"
author = "sac's developers"
copyright = "2026, sac's developers"

extensions = ["myst_parser", "breathe", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3

breathe_projects = {"sac": os.environ.get("SAC_DOXYGEN_XML", "../build/docs/doxygen/xml")}
breathe_default_project = "sac"
breathe_default_members = ("members",)

autodoc_member_order = "bysource"
autodoc_typehints = "none"

html_theme = "pydata_sphinx_theme"
html_title = "sac"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
