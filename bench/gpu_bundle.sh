#!/usr/bin/env bash
# gpu_bundle: the whole `swarm` program, for a machine without Bazel and
# without ZeroMQ, OpenDHT, OpenBLAS and the rest (the offline GPU machines that
# bench/gpu_check.sh runs on). Builds //apps:swarm with `--define portable=1`
# (-march=x86-64-v3 instead of -march=native, see //tools:flags.bzl) and packs
#
#   swarm-bundle/bin/swarm        the program
#   swarm-bundle/lib/             every shared library it needs that is not
#                                 glibc or part of the CUDA toolkit / driver
#   swarm-bundle/lib/gcc/         libstdc++, libgcc_s, libgomp: used only where
#                                 the machine's own are older (gpu_check.sh tries)
#   swarm-bundle/MANIFEST         when and how it was built, what ldd said
#
# into .gpu_deps/swarm-bundle.tar.xz. CUDA (cudart, cuBLAS, cuDNN) comes from
# the GPU machine: its toolkit and PyTorch's nvidia-cudnn wheel.
#
#   bash bench/gpu_bundle.sh      # bench/gpu_deps.sh runs it too
#
# A build with another --define re-analyses and relinks; afterwards this
# builds the default configuration again (all disk-cache hits) so that
# bazel-bin/apps/swarm is the usual -march=native program.
# SWARM_GPU_BUNDLE_NO_RESTORE=1 skips that.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT_TAR="$REPO/.gpu_deps/swarm-bundle.tar.xz"
mkdir -p "$REPO/.gpu_deps"

echo "gpu_bundle: ./bazelw build -c opt --define portable=1 //apps:swarm"
./bazelw build -c opt --define portable=1 //apps:swarm

STAGE=$(mktemp -d /tmp/swarm-bundle.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
B="$STAGE/swarm-bundle"
mkdir -p "$B/bin" "$B/lib/gcc"
cp -L bazel-bin/apps/swarm "$B/bin/swarm"
chmod u+w "$B/bin/swarm"
strip --strip-debug "$B/bin/swarm"

# x86-64-v3 has AVX2 and FMA but no AVX-512: a zmm register in the program's
# own code means -march=native leaked in (libraries such as OpenBLAS pick
# their kernels at run time and are not checked).
ZMM=$(objdump -d --no-show-raw-insn "$B/bin/swarm" | grep -c '%zmm' || true)
if [ "$ZMM" -ne 0 ]; then
  echo "gpu_bundle: the binary uses AVX-512 ($ZMM instructions with zmm registers): not portable" >&2
  exit 1
fi

# glibc, the dynamic loader, and CUDA's own libraries stay the target's.
is_excluded() {
  local name=$1 path=$2
  case "$path" in /usr/local/cuda*) return 0 ;; esac
  case "$name" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas*|libcudnn*|libnvrtc*|libnvJitLink*) return 0 ;;
  esac
  return 1
}
LDD=$(ldd "$B/bin/swarm")
if grep -q "not found" <<<"$LDD"; then
  echo "gpu_bundle: ldd finds no library for:" >&2
  grep "not found" <<<"$LDD" >&2
  exit 1
fi
while read -r name arrow path _; do
  [ "$arrow" = "=>" ] || continue
  is_excluded "$name" "$path" && continue
  case "$name" in
    libstdc++.so*|libgcc_s.so*|libgomp.so*) cp -L "$path" "$B/lib/gcc/$name" ;;
    *) cp -L "$path" "$B/lib/$name" ;;
  esac
done <<<"$LDD"

{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
  echo "command: ./bazelw build -c opt --define portable=1 //apps:swarm (-march=x86-64-v3)"
  echo "compiler: $(gcc --version | head -1); glibc: $(ldd --version | head -1 | awk '{print $NF}')"
  echo "sha256: $(sha256sum "$B/bin/swarm" | cut -d' ' -f1)"
  echo "bundled: $(cd "$B/lib" && find . -type f | sed 's#^\./##' | sort | tr '\n' ' ')"
  echo "ldd bin/swarm (here):"
  sed 's/^/  /' <<<"$LDD"
} > "$B/MANIFEST"

(cd "$STAGE" && XZ_OPT="-9 -T0" tar -cJf "$OUT_TAR.tmp" swarm-bundle)
mv "$OUT_TAR.tmp" "$OUT_TAR"
echo "gpu_bundle: $OUT_TAR ($(du -h "$OUT_TAR" | cut -f1); unpacked $(du -sh "$B" | cut -f1)): bin/swarm and $(find "$B/lib" -type f | wc -l) libraries"
sed -n '1,5p' "$B/MANIFEST"

if [ "${SWARM_GPU_BUNDLE_NO_RESTORE:-0}" != 1 ]; then
  echo "gpu_bundle: building the default (-march=native) //apps:swarm again"
  ./bazelw build -c opt //apps:swarm
fi
