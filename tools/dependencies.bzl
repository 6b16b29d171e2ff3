"""swarm_dependencies(): the external repositories swarm's targets need, for the
WORKSPACE of swarm itself and of any project that depends on it.

    local_repository(name = "swarm", path = "/path/to/swarm")
    load("@swarm//tools:dependencies.bzl", "swarm_dependencies")
    swarm_dependencies(swarm_path = "/path/to/swarm")

Everything is local (Debian packages that ./bazelw installs, and rule sets kept in
third_party/), so a build needs no network. `swarm_path` is where swarm's checkout
is, absolute or relative to the calling workspace: local_repository paths are read
from there, not from this file.
"""

def swarm_dependencies(swarm_path = "."):
    third_party = swarm_path + "/third_party"

    # Debian's bazel-bootstrap would otherwise try to download these rule sets.
    native.local_repository(name = "rules_cc", path = third_party + "/rules_cc")
    native.local_repository(name = "rules_java", path = third_party + "/rules_java")
    native.local_repository(name = "remote_coverage_tools", path = third_party + "/remote_coverage_tools")
    native.local_repository(name = "platforms", path = "/usr/share/bazel/tools/platforms")

    # System packages whose headers live outside /usr/include's default search.
    native.new_local_repository(
        name = "eigen",
        build_file = str(Label("//third_party:eigen.BUILD")),
        path = "/usr/include/eigen3",
    )

    # OpenBLAS built on OpenMP (Debian's libopenblas-openmp-dev): the CPU backend's
    # GEMMs share the kernels' OpenMP thread pool instead of starting their own.
    native.new_local_repository(
        name = "openblas",
        build_file = str(Label("//third_party:openblas.BUILD")),
        path = "/usr/include/x86_64-linux-gnu/openblas-openmp",
    )
    native.new_local_repository(
        name = "cuda",
        build_file = str(Label("//third_party:cuda.BUILD")),
        path = "/usr/local/cuda",
    )
