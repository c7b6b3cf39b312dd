"""Every Python example of the user pages runs as written, each in a fresh
namespace (its asserts are the page's own claims): the tutorials
(docs/tutorial/*.md) and the how-to pages in PAGES."""
import glob
import os
import re

import pytest

import torch_sac as sac
from support import no_collection, one_thread  # noqa: F401 (a fixture)

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
PAGES = sorted(glob.glob(os.path.join(DOCS, "tutorial", "*.md"))) + [
    os.path.join(DOCS, "python.md")]
EXAMPLES = [(os.path.relpath(page, DOCS), i, code)
            for page in PAGES
            for i, code in enumerate(re.findall(r"```python\n(.*?)```", open(page).read(), re.S))]


def test_the_tutorials_have_examples():
    assert {page for page, _, _ in EXAMPLES} >= {"tutorial/first-checkpoint.md", "tutorial/fit.md",
                                                "python.md"}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("page,index,code", EXAMPLES, ids=[f"{p}:{i}" for p, i, _ in EXAMPLES])
def test_a_page_example_runs(page, index, code):
    if "sac.region(" in code and not sac.mechanism().startswith("fallback"):
        pytest.skip("sac.region needs SAC_DISPATCH=fallback (the page says so)")
    with no_collection():
        exec(compile(code, os.path.join(DOCS, page), "exec"), {"__name__": f"example_{index}"})
