"""cuda_library: compiles .cu files with nvcc into a cc_library.

Each .cu becomes one position-independent object through a genrule that calls
/usr/local/cuda/bin/nvcc with NVCC_OPTS from //tools:flags.bzl. The objects are
wrapped in a cc_library that links cudart, so C++ targets depend on it as usual.
Compiling needs only the toolkit; running needs a GPU.
"""

load("//tools:flags.bzl", "NVCC_OPTS", "NVCC_OPTS_PORTABLE")

NVCC = "/usr/local/cuda/bin/nvcc"

def _nvcc_command(opts, src):
    # Built as another workspace's @swarm, swarm's includes are rooted there.
    repository = native.repository_name().lstrip("@")
    root = "external/%s" % repository if repository else "."
    return " ".join([
        NVCC,
        " ".join(opts),
        "-I%s" % root,
        "-I$(GENDIR)/%s" % root,
        "-isystem /usr/include/eigen3",
        "-c $(location %s)" % src,
        "-o $@",
    ])

def cuda_library(name, srcs, hdrs = [], deps = [], cuda_hdrs = [], nvcc_opts = [], visibility = None, **kwargs):
    """Args:
      srcs: .cu files.
      hdrs: headers this library exports (also visible to nvcc).
      deps: cc_library deps for the C++ side of the link.
      cuda_hdrs: extra header files (or filegroups) that the .cu files include.
      nvcc_opts: extra nvcc flags for this library only.
    """
    objs = []
    for src in srcs:
        stem = src.rsplit(".", 1)[0].replace("/", "_")
        obj = "_nvcc/%s/%s.pic.o" % (name, stem)
        native.genrule(
            name = "%s_nvcc_%s" % (name, stem),
            srcs = [src] + hdrs + cuda_hdrs,
            outs = [obj],
            # --define portable=1: host code for x86-64-v3 instead of this CPU.
            cmd = select({
                "//tools:portable": _nvcc_command(NVCC_OPTS_PORTABLE + nvcc_opts, src),
                "//conditions:default": _nvcc_command(NVCC_OPTS + nvcc_opts, src),
            }),
            message = "nvcc %s" % src,
            tags = ["cuda"],
        )
        objs.append(obj)

    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//third_party:cuda_runtime"],
        linkstatic = 1,
        visibility = visibility,
        **kwargs
    )
