"""pyproject.toml's metadata provider (scikit-build-core): the wheel's
version and requirement name the torch it is built against, read from the
building Python's installed torch (the build is not isolated).

    version       0.1.0+torch2.15.0   (the base version, and the torch release)
    dependencies  torch==2.15.0

sac's binaries link torch's C++ libraries, whose ABI is a release's own, so
a wheel installs beside its torch release and no other: pip refuses any
other at install time, and `pip install --no-index --find-links DIR
torch-sac` takes, from a folder holding wheels for several releases, the
one for the torch installed. The import checks the same (torch_sac/__init__.py).
"""
from importlib import metadata


def _torch_release() -> str:
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        raise RuntimeError(
            "torch-sac builds against the installed torch, and this Python has none: "
            "install torch first, then build without isolation "
            "(pip install --no-build-isolation .)") from None
    return version.split("+")[0]


def dynamic_metadata(field, settings, project=None):
    if field == "version":
        return f"{settings['base']}+torch{_torch_release()}"
    if field == "dependencies":
        return [f"torch=={_torch_release()}"]
    raise RuntimeError(f"torch_pin provides version and dependencies, not {field}")
