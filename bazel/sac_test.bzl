"""sac_test: one test source, run once per SAC_DISPATCH mode.

CMake runs every test twice, with SAC_DISPATCH=per_op and SAC_DISPATCH=fallback.
For a test `foo_test` this macro creates
  foo_test_lib        cc_library with the test sources (alwayslink, compiled once)
  foo_test_per_op     cc_test, env SAC_DISPATCH=per_op
  foo_test_fallback   cc_test, env SAC_DISPATCH=fallback
  foo_test            test_suite with both
`modes` narrows the modes (the README example needs the fallback key).
Default timeout "long" (900 s); CMake gives each test 600 s.
"""

SAC_DISPATCH_MODES = ["per_op", "fallback"]

def sac_test(
        name,
        srcs,
        deps = [],
        copts = [],
        data = [],
        env = {},
        tags = [],
        size = "medium",
        timeout = "long",
        modes = SAC_DISPATCH_MODES,
        **kwargs):
    lib = name + "_lib"
    native.cc_library(
        name = lib,
        srcs = srcs,
        copts = copts,
        deps = deps,
        alwayslink = True,
        testonly = True,
        tags = tags,
        visibility = ["//visibility:private"],
    )

    tests = []
    for mode in modes:
        test_env = dict(env)
        test_env["SAC_DISPATCH"] = mode
        native.cc_test(
            name = name + "_" + mode,
            deps = [":" + lib],
            data = data,
            env = test_env,
            size = size,
            timeout = timeout,
            tags = tags + ["sac_dispatch_" + mode],
            **kwargs
        )
        tests.append(":" + name + "_" + mode)

    native.test_suite(
        name = name,
        tests = tests,
        tags = tags,
    )

def sac_tests(srcs, **kwargs):
    """One sac_test per `*_test.cpp` file in srcs, named after the file."""
    for src in srcs:
        base = src.rsplit("/", 1)[-1]
        if not base.endswith(".cpp"):
            fail("sac_tests: expected a .cpp file, got " + src)
        sac_test(name = base[:-len(".cpp")], srcs = [src], **kwargs)
