"""Every Python example of the tutorials (docs/tutorial/*.md) runs as written,
each in a fresh namespace (its asserts are the tutorial's own claims)."""
import glob
import os
import re

import pytest

from support import no_collection, one_thread  # noqa: F401 (a fixture)

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
EXAMPLES = [(os.path.relpath(page, DOCS), i, code)
            for page in sorted(glob.glob(os.path.join(DOCS, "tutorial", "*.md")))
            for i, code in enumerate(re.findall(r"```python\n(.*?)```", open(page).read(), re.S))]


def test_the_tutorials_have_examples():
    assert {page for page, _, _ in EXAMPLES} >= {"tutorial/first-checkpoint.md", "tutorial/fit.md"}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("page,index,code", EXAMPLES, ids=[f"{p}:{i}" for p, i, _ in EXAMPLES])
def test_a_tutorial_example_runs(page, index, code):
    with no_collection():
        exec(compile(code, os.path.join(DOCS, page), "exec"), {"__name__": f"example_{index}"})
