"""Repository rule exposing LibTorch from the installed `torch` pip wheel.

Asks python3 (or $SAC_PYTHON) where the torch package lives, symlinks its
`include/` and `lib/` directories into the repository and instantiates
`torch.BUILD.tpl`. Nothing is downloaded.

The generated `@torch//:torch` cc_library links libtorch, libtorch_cpu and
libc10 by absolute path with an absolute RUNPATH to torch/lib, so binaries and
tests run without LD_LIBRARY_PATH (libtorch_cpu finds its own libgomp through
its $ORIGIN RUNPATH).
"""

_PROBE = """
import os, sys, importlib.util
spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    sys.exit("python module 'torch' not found for " + sys.executable)
root = os.path.realpath(list(spec.submodule_search_locations)[0])
import torch
print(root)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.__version__)
"""

def _torch_repository_impl(rctx):
    python = rctx.os.environ.get("SAC_PYTHON", "") or rctx.attr.python
    if "/" not in python:
        found = rctx.which(python)
        if not found:
            fail("torch_repository: '%s' not found on PATH; set SAC_PYTHON" % python)
        python = str(found)

    res = rctx.execute([python, "-c", _PROBE], timeout = 300, quiet = True)
    if res.return_code != 0:
        fail("torch_repository: could not locate torch with %s:\n%s%s" % (python, res.stdout, res.stderr))
    lines = [l.strip() for l in res.stdout.strip().splitlines() if l.strip()]
    if len(lines) < 3:
        fail("torch_repository: unexpected probe output from %s:\n%s" % (python, res.stdout))
    torch_dir, abi, version = lines[-3], lines[-2], lines[-1]
    if abi != "1":
        fail("torch_repository: torch %s at %s uses the old C++ ABI (_GLIBCXX_USE_CXX11_ABI=0); " % (version, torch_dir) +
             ".bazelrc builds with -D_GLIBCXX_USE_CXX11_ABI=1")

    lib_dir = torch_dir + "/lib"
    for f in ["include", "include/torch/csrc/api/include", "lib/libtorch.so", "lib/libtorch_cpu.so", "lib/libc10.so"]:
        if not rctx.path(torch_dir + "/" + f).exists:
            fail("torch_repository: %s/%s missing (torch %s)" % (torch_dir, f, version))

    rctx.symlink(torch_dir + "/include", "include")
    rctx.symlink(lib_dir, "lib")
    rctx.template(
        "BUILD.bazel",
        rctx.attr._build_tpl,
        substitutions = {
            "%{TORCH_DIR}": torch_dir,
            "%{TORCH_LIB_DIR}": lib_dir,
            "%{TORCH_VERSION}": version,
        },
        executable = False,
    )
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)

torch_repository = repository_rule(
    implementation = _torch_repository_impl,
    attrs = {
        "python": attr.string(default = "python3"),
        "_build_tpl": attr.label(default = Label("//bazel:torch.BUILD.tpl")),
    },
    environ = ["SAC_PYTHON"],
    local = True,
)
