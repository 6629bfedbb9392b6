"""Sphinx configuration of the sb3-npg documentation (``make docs``)."""

import sys
from pathlib import Path

from sphinx import addnodes
from sphinx.pycode import ModuleAnalyzer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sb3_npg import __version__  # noqa: E402

project = "sb3-npg"
author = "sb3-npg developers"
copyright = "sb3-npg developers"
version = release = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

html_theme = "furo"
html_title = f"sb3-npg {release}"
html_static_path = ["_static"]

#: Names re-exported by a package, documented with the ``#:`` comment of the module that defines them.
REEXPORTED = {
    "sb3_npg.FAST_SETTINGS": "sb3_npg.common.algorithm",
    "sb3_npg.zoo.ZOO_ALGOS": "sb3_npg.zoo.registry",
}


def _defining_module_comment(app, what, name, obj, options, lines):
    # Without this, autodoc finds no comment in the re-exporting package and shows the value's type's docstring.
    if what == "data" and name in REEXPORTED:
        attr_docs = ModuleAnalyzer.for_module(REEXPORTED[name]).find_attr_docs()
        lines[:] = list(attr_docs.get(("", name.rsplit(".", 1)[1]), []))


#: Repository files that Markdown pages link to (``design.md`` links the READMEs), and their page in this site.
REPOSITORY_PAGES = {ROOT / "README": "index", ROOT / "benchmarks" / "README": "benchmarks"}


def _link_repository_pages(app, doctree):
    for node in doctree.findall(addnodes.pending_xref):
        if node.get("reftype") == "myst" and node.get("refdomain") == "doc":
            page = REPOSITORY_PAGES.get(Path(node["reftarget"]))
            if page is not None:
                node["reftarget"] = page


def setup(app):
    app.connect("autodoc-process-docstring", _defining_module_comment)
    app.connect("doctree-read", _link_repository_pages)
