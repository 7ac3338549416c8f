#!/usr/bin/env bash
# Builds cuda-emu into target/cuda-emu/lib: a fake CUDA driver, cuBLAS(Lt), cuRAND, NVRTC and NVML
# that run our kernels (models/src/embed/fused_kernels.cu) and candle's element-wise,
# reduction, indexing and sort kernels on the CPU, compiled by g++ against device.h. With
# LD_LIBRARY_PATH=target/cuda-emu/lib, a `cuda` build of Resident runs its GPU code paths on a
# machine without a GPU: see scripts/cuda-emu.sh and README.md here.
#
# Needs the CUDA toolkit's headers (scripts/build-cuda.sh --toolkit installs them) and g++.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=scripts/cuda-emu
toolkit="${RESIDENT_CUDA_TOOLKIT:-$PWD/target/cuda-toolkit}"
include="$toolkit/nvidia/cu13/include"
if [[ ! -f "$include/cuda.h" ]]; then
  scripts/build-cuda.sh --toolkit
fi
out=target/cuda-emu
lib=$out/lib
work=$out/work
mkdir -p "$lib/kernels" "$work"
cxx=(g++ -std=c++17 -O2 -g -fPIC -fno-strict-aliasing -I"$include" -I"$include/cccl" -I"$here")

# The entry points cudarc names for a library, as stubs that print their name and fail with
# `$3` (a status the caller can read), less those `$2` (an object file) defines.
stubs() {
  local sys=$1 object=$2 status=$3 out_file=$4
  local registry
  registry=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src | tail -1)
  {
    echo '#include <stdio.h>'
    echo 'static int unemulated(const char *name, int status) {'
    echo '    fprintf(stderr, "cuda-emu: %s is not emulated (scripts/cuda-emu)\n", name);'
    echo '    return status;'
    echo '}'
    grep -oh 'pub unsafe fn [A-Za-z0-9_]*(' "$registry/$sys/sys/mod.rs" | sed 's/pub unsafe fn \(.*\)(/\1/' |
      sort -u | comm -23 - <(nm -g --defined-only "$object" | awk '{print $3}' | sort -u) |
      sed "s/.*/int &(void) { return unemulated(\"&\", $status); }/"
  } > "$out_file"
}

# The runtime (fibers, barriers, mma) is compiled into the driver; the other libraries call
# the driver to issue their work on a stream.
"${cxx[@]}" -c "$here/runtime.cpp" -o "$work/runtime.o"
"${cxx[@]}" -c "$here/stats.cpp" -o "$work/stats.o"
"${cxx[@]}" -c "$here/driver.cpp" -o "$work/driver.o"
stubs driver "$work/driver.o" 801 "$work/driver-stubs.c"
# runtime.o and stats.o define nothing cudarc names, so the stubs are those of driver.o.
gcc -O1 -fPIC -c "$work/driver-stubs.c" -o "$work/driver-stubs.o"
g++ -shared -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so.1" \
  "$work/driver.o" "$work/runtime.o" "$work/stats.o" "$work/driver-stubs.o" -lpthread -ldl
ln -sf libcuda.so.1 "$lib/libcuda.so"

"${cxx[@]}" -O3 -march=native -c "$here/blas.cpp" -o "$work/blas.o"
# One library under both names: cuBLAS's stubs and cuBLASLt's, less what blas.o defines.
for name in cublas cublaslt; do
  stubs "$name" "$work/blas.o" 15 "$work/$name-stubs.c"  # CUBLAS_STATUS_NOT_SUPPORTED
done
cat "$work/cublas-stubs.c" > "$work/blas-stubs.c"
grep '^int cublasLt' "$work/cublaslt-stubs.c" >> "$work/blas-stubs.c" || true
gcc -O1 -fPIC -c "$work/blas-stubs.c" -o "$work/blas-stubs.o"
# The real libraries version their symbols (a binary asks for `cublasCreate_v2@libcublas.so.13`).
for soname in libcublas.so.13 libcublasLt.so.13; do
  echo "$soname { global: *; };" > "$work/$soname.map"
  g++ -shared -Wl,-soname,$soname -Wl,--version-script="$work/$soname.map" -o "$lib/$soname" "$work/blas.o" "$work/blas-stubs.o" \
    -L"$lib" -l:libcuda.so.1 -lpthread
done

"${cxx[@]}" -c "$here/rand.cpp" -o "$work/rand.o"
stubs curand "$work/rand.o" 999 "$work/curand-stubs.c"  # CURAND_STATUS_INTERNAL_ERROR
gcc -O1 -fPIC -c "$work/curand-stubs.c" -o "$work/curand-stubs.o"
echo "libcurand.so.10 { global: *; };" > "$work/libcurand.map"
g++ -shared -Wl,-soname,libcurand.so.10 -Wl,--version-script="$work/libcurand.map" -o "$lib/libcurand.so.10" "$work/rand.o" \
  "$work/curand-stubs.o" -L"$lib" -l:libcuda.so.1 -lpthread
# NVML, for the agent's GPU fault watcher: it reads the driver's planned Xids.
"${cxx[@]}" -shared -Wl,-soname,libnvidia-ml.so.1 -o "$lib/libnvidia-ml.so.1" "$here/nvml.cpp" \
  -L"$lib" -l:libcuda.so.1 -lpthread
printf '' > "$work/empty.c"
gcc -O1 -fPIC -c "$work/empty.c" -o "$work/empty.o"
stubs nvrtc "$work/empty.o" 7 "$work/nvrtc-stubs.c"  # NVRTC_ERROR_BUILTIN_OPERATION_FAILURE
gcc -O1 -fPIC -shared -Wl,-soname,libnvrtc.so.13 -o "$lib/libnvrtc.so.13" "$work/nvrtc-stubs.c"

# The kernel modules, for sm_90 and sm_75: each source with `extern __shared__` arrays made
# pointers to the launch's dynamic shared memory, and a table of its `extern "C"` kernels.
module() {
  local source=$1 name=$2 arch=$3
  local dir
  dir=$(dirname "$source")
  local copy="$work/$name-sm$arch.cpp"
  sed -E 's/extern __shared__ ([A-Za-z_0-9 ]+) ([A-Za-z_0-9]+)\[\];/\1 *\2 = static_cast<\1 *>(emu::dynamic_shared());/' \
    "$source" > "$copy"
  local flags=(-w -DEMU_ARCH="${arch}0" -I"$dir" -include "$here/device.h")
  local names
  names=$("${cxx[@]}" "${flags[@]}" -E "$copy" |
    grep -oE 'extern "C" +void +[A-Za-z_0-9]+ *\(' | sed -E 's/extern "C" +void +([A-Za-z_0-9]+).*/\1/' | sort -u)
  {
    echo "#include \"$PWD/$copy\""
    echo 'extern "C" const emu::Kernel *emu_kernels(size_t *count) {'
    echo '    static const emu::Kernel kernels[] = {'
    for kernel in $names; do echo "        emu::kernel(\"$kernel\", &$kernel),"; done
    echo '    };'
    echo '    *count = sizeof(kernels) / sizeof(kernels[0]);'
    echo '    return kernels;'
    echo '}'
  } > "$work/$name-sm$arch-table.cpp"
  "${cxx[@]}" "${flags[@]}" -shared "$work/$name-sm$arch-table.cpp" \
    -o "$lib/kernels/$name-sm$arch.so" -L"$lib" -l:libcuda.so.1
}
export -f module
export here work lib PWD
export CXX_FLAGS="${cxx[*]}"
jobs=()
for arch in 90 75; do
  jobs+=("models/src/embed/fused_kernels.cu resident $arch")
  for name in affine binary cast fill indexing quantized reduce sort ternary unary; do
    jobs+=("vendor/candle-kernels/src/$name.cu candle-$name $arch")
  done
done
printf '%s\n' "${jobs[@]}" | xargs -P "$(nproc)" -L 1 bash -c 'cxx=($CXX_FLAGS); module "$@"' _
echo "cuda-emu: $(ls "$lib/kernels" | wc -l) kernel modules and the libraries in $lib"
