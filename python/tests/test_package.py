"""The package as a typed product: __all__, the stubs of the C++ module, the
typing marker, and CheckpointError's place under PyTorch's."""
import ast
import os

import torch

import torch_sac as sac


def test_all_names_exist_and_are_documented():
    assert len(set(sac.__all__)) == len(sac.__all__)
    for name in sac.__all__:
        value = getattr(sac, name)
        if callable(value) and name not in ("Op", "PolicyLike"):
            assert value.__doc__, f"torch_sac.{name} has no docstring"


def test_the_stubs_describe_the_module_exactly():
    where = os.path.dirname(sac.__file__)
    assert os.path.exists(os.path.join(where, "py.typed"))
    with open(os.path.join(where, "_C.pyi")) as f:
        tree = ast.parse(f.read())
    stubbed = {node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    exported = {name for name in dir(sac._C) if not name.startswith("__")}
    exported.discard("_PackedTensor")  # an opaque holder, never seen by users
    assert stubbed == exported, (sorted(stubbed - exported), sorted(exported - stubbed))


def test_checkpoint_error_is_pytorchs():
    assert issubclass(sac.CheckpointError, torch.utils.checkpoint.CheckpointError)
    assert issubclass(sac.CheckpointError, RuntimeError)


def test_the_version_names_sac_and_the_torch_it_was_built_against():
    # The wheel's version (python/build_backend/torch_pin.py): sac's, then
    # the torch release it pins. Installed, the package's metadata agrees.
    from importlib import metadata
    release = torch.__version__.split("+")[0]
    assert sac.__version__.endswith(f"+torch{release}"), sac.__version__
    assert sac.__version__.split("+")[0].count(".") == 2, sac.__version__
    try:
        dist = metadata.distribution("torch-sac")
    except metadata.PackageNotFoundError:  # a build tree on sys.path
        return
    if os.path.realpath(dist.locate_file("torch_sac/__init__.py")) == os.path.realpath(sac.__file__):
        assert sac.__version__ == dist.version
