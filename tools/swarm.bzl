"""Thin wrappers over the native C++ rules that apply the project's flags."""

load("//tools:flags.bzl", "CXX_OPTS")

def swarm_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = CXX_OPTS + copts, **kwargs)

def swarm_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = CXX_OPTS + copts, **kwargs)

def swarm_cc_test(name, srcs, deps = [], copts = [], **kwargs):
    """A doctest test: links the one shared main in //tests:doctest_main."""
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = CXX_OPTS + copts,
        deps = deps + ["//tests:doctest_main"],
        **kwargs
    )

def swarm_cc_test_in_processes(name, srcs, processes, deps = [], data = [], copts = [], tags = [], **kwargs):
    """A doctest test whose cases run in `processes` processes at once, each a
    contiguous share with its own $TEST_TMPDIR (tests/doctest_in_processes.sh):
    for cases that mostly wait, such as swarms of processes with slept compute.
    The cases are a testonly binary, name + "_cases"."""
    cases = name + "_cases"
    native.cc_binary(
        name = cases,
        testonly = True,
        srcs = srcs,
        copts = CXX_OPTS + copts,
        deps = deps + ["//tests:doctest_main"],
        data = data,
        tags = tags,
    )
    native.sh_test(
        name = name,
        srcs = ["//tests:doctest_in_processes.sh"],
        args = ["$(rootpath :%s)" % cases, str(processes)],
        data = [":" + cases] + data,
        tags = tags,
        **kwargs
    )

def swarm_cc_benchmark(name, srcs, deps = [], copts = [], tags = [], **kwargs):
    """A Google Benchmark program, run as a test only when asked for by tag."""
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = CXX_OPTS + copts,
        deps = deps + ["//bench:bench_main"],
        tags = tags + ["benchmark", "exclusive"],
        **kwargs
    )

def swarm_gpu_benchmark(name, srcs, deps = [], copts = [], tags = [], **kwargs):
    """A GPU benchmark program with its own main(): prints ratios, or
    "skipped: no CUDA device" and exits 0 where there is none. Run only when
    asked for by tag (benchmark), alone (exclusive)."""
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = CXX_OPTS + copts,
        deps = deps + ["//bench/gpu:gpu_timer"],
        tags = tags + ["benchmark", "cuda", "exclusive"],
        **kwargs
    )
