#!/usr/bin/env bash
# Type-check every Ascend C kernel source against the real CANN headers in CPU-debug mode.
#
#   ASCEND_HOME_PATH=<toolkit root, e.g. .../ascend-toolkit/8.1.RC1> scripts/check_ascendc.sh [file.cpp ...]
#
# Compiles ascend_ops/kernel/*.cpp (or the files given) with `g++ -std=c++17 -fsyntax-only` (or $CXX) and the flags
# CANN's own CPU-debug build passes for 910B (dav-c220). Passes only when there are no errors and
# no warnings from our files (warnings inside the CANN headers are ignored: they are -isystem).
# Exit codes: 0 clean; 1 errors or warnings; 2 ASCEND_HOME_PATH unset or without the headers.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kdir="$here/ascend_ops/kernel"
CXX="${CXX:-g++}"

if [ -z "${ASCEND_HOME_PATH:-}" ]; then
    echo "check_ascendc: ASCEND_HOME_PATH is not set; point it at a CANN toolkit root (headers needed)" >&2
    exit 2
fi
root="$ASCEND_HOME_PATH"
arch=""
for a in aarch64-linux x86_64-linux; do
    [ -d "$root/$a/ascendc/include/basic_api" ] && arch="$a" && break
done
if [ -z "$arch" ] || [ ! -f "$root/tools/tikicpulib/lib/include/stub_def.h" ]; then
    echo "check_ascendc: no Ascend C CPU-debug headers under $root" \
         "(expected <arch>-linux/ascendc/include and tools/tikicpulib/lib/include)" >&2
    exit 2
fi
inc="$root/$arch/ascendc/include"
flags=(-std=c++17 -fsyntax-only -Wall -Wextra
       -D_GLIBCXX_USE_CXX11_ABI=0 -D__CCE_KT_TEST__=1 -DASCENDC_CPU_DEBUG=1 -DASCENDC_DEBUG=1
       -D__CCE_AICORE__=220 -D__DAV_C220__
       -isystem "$root/tools/tikicpulib/lib/include" -isystem "$root/$arch/include"
       -isystem "$inc/basic_api" -isystem "$inc/basic_api/interface" -isystem "$inc/basic_api/impl"
       -isystem "$inc/highlevel_api/lib" -isystem "$inc/highlevel_api/impl"
       -isystem "$inc/highlevel_api/lib/matmul" -isystem "$inc/highlevel_api" -isystem "$inc"
       -I "$kdir")

status=0
if [ $# -gt 0 ]; then srcs=("$@"); else srcs=("$kdir"/*.cpp); fi
# A source with a cube part (ASCEND_IS_AIC) is compiled twice, as bisheng does for a mixed
# kernel: the cube (AIC) pass with __DAV_C220_CUBE__, the vector (AIV) pass with __DAV_C220_VEC__.
for src in "${srcs[@]}"; do
  passes=("")
  if grep -q "ASCEND_IS_AIC" "$src"; then passes=("-D__DAV_C220_CUBE__" "-D__DAV_C220_VEC__"); fi
  for pass in "${passes[@]}"; do
    sdir="$(cd "$(dirname "$src")" && pwd)"
    # shellcheck disable=SC2086
    out="$("$CXX" "${flags[@]}" $pass "$src" 2>&1)"
    rc=$?
    # diagnostics that point into our kernel folder (errors or warnings)
    ours="$(printf '%s\n' "$out" | grep -E "^($kdir|$sdir)/[^:]+:[0-9]+:[0-9]+: (error|warning)" || true)"
    if [ $rc -ne 0 ] || [ -n "$ours" ]; then
        echo "FAIL $(basename "$src") ${pass}"
        printf '%s\n' "$out" | head -60
        status=1
    else
        echo "ok   $(basename "$src") ${pass}"
    fi
  done
done
exit $status
