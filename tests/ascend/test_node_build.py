"""The node build's plumbing (``python -m ascend_ops.build``), with a stand-in CANN and torch_npu.

Both routes (CMake with ``ascendc_library()``, and ``--route bisheng``) end to end with stand-ins
for CANN (an ``ascendc.cmake``, ``acl/acl_base.h``, an empty ``libascendcl``, a ``bisheng`` that
checks its flags) and torch_npu (the offline headers; a ``libtorch_npu`` from the stubs). Says
nothing about a real toolkit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .sources import HAS_CXX, LAUNCH, OFFLINE

torch = pytest.importorskip("torch")

from ascend_ops import build  # noqa: E402


FAKE_ASCENDC_CMAKE = r"""
# Stand-in for CANN's ascendc.cmake: ascendc_library() makes an ordinary static library (the
# kernels are not compiled: no bisheng here) whose include directory holds the launch headers the
# real one generates (here: the offline stand-ins).
function(ascendc_library name kind)
    set(srcs ${ARGN})
    foreach(src ${srcs})
        if(NOT EXISTS "${src}")
            message(FATAL_ERROR "ascendc_library: no such kernel source ${src}")
        endif()
    endforeach()
    file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/${name}_empty.cpp" "int ${name}_kernels_not_compiled_here;\n")
    add_library(${name} ${kind} "${CMAKE_CURRENT_BINARY_DIR}/${name}_empty.cpp")
    target_include_directories(${name} PUBLIC "@LAUNCH_DIR@")
    set(SPLITKV_FAKE_KERNEL_SOURCES "${srcs}" PARENT_SCOPE)
endfunction()
"""


@pytest.fixture
def fake_node(tmp_path, monkeypatch):
    """Stand-ins for a node's CANN (``ascendc.cmake``, ``acl/acl_base.h``, an empty ``libascendcl``,
    a ``bisheng`` that checks its flags and builds the launch functions from stubs) and torch_npu
    (the offline headers; a ``libtorch_npu`` from the stubs). Returns ``(cann, torch_npu)``."""
    if not (HAS_CXX and shutil.which("cmake")):
        pytest.skip("needs a C++ compiler and cmake")
    import torch.utils.cpp_extension as ext

    cann = tmp_path / "cann"
    cm = cann / "tools" / "tikcpp" / "ascendc_kernel_cmake"
    cm.mkdir(parents=True)
    (cm / "ascendc.cmake").write_text(FAKE_ASCENDC_CMAKE.replace("@LAUNCH_DIR@", str(LAUNCH)))
    shutil.copytree(OFFLINE / "acl", cann / "include" / "acl")
    (cann / "lib64").mkdir()
    npu = tmp_path / "torch_npu"
    shutil.copytree(OFFLINE / "torch_npu", npu / "include" / "torch_npu")
    (npu / "lib").mkdir()
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    torch_lib = Path(ext.include_paths()[0]).parent / "lib"
    subprocess.run([cxx, "-shared", "-fPIC", "-x", "c++", "/dev/null", "-o", str(cann / "lib64" / "libascendcl.so")],
                   check=True)
    subprocess.run([cxx, "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={build.torch_abi()}",
                    *[f"-isystem{p}" for p in ext.include_paths()], f"-I{OFFLINE}", f"-I{LAUNCH}",
                    str(OFFLINE / "stub_runtime.cpp"), f"-L{torch_lib}", "-lc10",
                    "-o", str(npu / "lib" / "libtorch_npu.so")], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub_c = tmp_path / "launch_stub.c"
    stub_c.write_text("#include <stdint.h>\n"
                      "uint32_t aclrtlaunch_splitkv_split(uint32_t b, void *s, void *a0, void *a1, void *a2, "
                      "void *a3, void *a4, void *a5, void *a6, void *a7) { return 0; }\n"
                      "uint32_t aclrtlaunch_splitkv_combine(uint32_t b, void *s, void *a0, void *a1, void *a2, "
                      "void *a3, void *a4) { return 0; }\n"
                      "uint32_t aclrtlaunch_splitkv_attention_mix(uint32_t b, void *s, void *a0, void *a1, void *a2, "
                      "void *a3, void *a4, void *a5, void *a6, void *a7, void *a8, void *a9) { return 0; }\n")
    (bin_dir / "bisheng").write_text(f"""#!/usr/bin/env bash
# stand-in: check the flags the real bisheng gets, then build the launch functions from stubs
set -euo pipefail
echo "$@" > {tmp_path / 'bisheng.args'}
[[ " $* " == *" -x asc "* && " $* " == *" --npu-arch=dav-2201 "* ]] || {{ echo "bad flags: $*" >&2; exit 1; }}
out=""; prev=""
for a in "$@"; do [[ "$prev" == "-o" ]] && out="$a"; prev="$a"; done
exec {cxx} -shared -fPIC -x c {stub_c} -o "$out"
""")
    (bin_dir / "bisheng").chmod(0o755)
    real_package_dir = build.package_dir
    monkeypatch.setattr(build, "package_dir",
                        lambda name, hint: npu if name == "torch_npu" else real_package_dir(name, hint))
    monkeypatch.setattr(build, "LIB_DIR", tmp_path / "_lib")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(cann))
    monkeypatch.setenv("SPLITKV_ASCEND_SOC", "Ascend910B3")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return cann, npu


def _resolved(lib: Path, dep: str) -> bool:
    ldd = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    line = [x for x in ldd.splitlines() if dep in x]
    return bool(line) and "not found" not in line[0]


@pytest.mark.slow
def test_node_build_plumbing_with_stand_ins(fake_node, tmp_path):
    """scripts/build_ascend.sh's Python + CMake path end to end, with CANN and torch_npu replaced by
    stand-ins. Checks the CMakeLists (paths, kernel glob, include dirs, libraries, rpath), the copy
    into the package and that the result loads against the schema. Says nothing about a real toolkit."""
    cann, npu = fake_node
    logs = []
    lib = build.node_build(build_dir=tmp_path / "build", jobs=2, log=logs.append)
    assert lib == tmp_path / "_lib" / build.LIB_FILE and lib.is_file()
    assert any("-DSOC_VERSION=Ascend910B3" in x for x in logs)
    cache = (tmp_path / "build" / "CMakeCache.txt").read_text()
    assert f"TORCH_NPU_PATH:PATH={npu}" in cache
    assert build.load_check(lib).startswith("ok")
    assert _resolved(lib, "libtorch_npu.so")


@pytest.mark.slow
def test_node_build_bisheng_route_with_stand_ins(fake_node, tmp_path):
    """The ``--route bisheng`` path: bisheng gets ``-x asc --npu-arch=dav-2201`` and both launch
    sources; the binding links the kernels' library, found next to it through ``$ORIGIN``."""
    lib = build.node_build(build_dir=tmp_path / "build", log=lambda *a: None, route="bisheng")
    args = (tmp_path / "bisheng.args").read_text().split()
    assert {"-x", "asc", "--npu-arch=dav-2201", "-shared"} <= set(args)
    assert [Path(a).name for a in args if a.endswith(".asc")] == list(build.LAUNCH_SOURCES)
    assert (lib.parent / build.KERNELS_LIB_FILE).is_file()
    assert _resolved(lib, build.KERNELS_LIB_FILE) and _resolved(lib, "libtorch_npu.so")
    assert build.load_check(lib).startswith("ok")


@pytest.mark.slow
def test_node_build_bisheng_route_refuses_cann_8_1(fake_node, tmp_path, monkeypatch):
    """CANN 8.1's direct bisheng call compiles one core type: a mixed kernel built that way would hang
    at its first cross-core wait, so the route refuses before compiling anything."""
    monkeypatch.setenv(build.CANN_VERSION_ENV, "8.1")
    with pytest.raises(build.BuildError, match="route bisheng: CANN 8.1 .* use the default cmake route"):
        build.node_build(build_dir=tmp_path / "build", route="bisheng", log=lambda *a: None)
    assert not (tmp_path / "bisheng.args").exists()


def test_bisheng_flags_follow_the_installed_cann_version(tmp_path, monkeypatch):
    from ascend_ops import build

    monkeypatch.delenv(build.CANN_VERSION_ENV, raising=False)
    assert build.cann_version(tmp_path) is None
    (tmp_path / "aarch64-linux").mkdir()
    (tmp_path / "aarch64-linux" / "ascend_toolkit_install.info").write_text("package_name=x\nversion=8.1.RC1\n")
    assert build.cann_version(tmp_path) == (8, 1)
    for old in ((8, 1), (8, 2)):
        with pytest.raises(build.BuildError, match="dav-c220-cube and a dav-c220-vec pass"):
            build.bisheng_lang_flags(old, "Ascend910B2")
    (tmp_path / "ascend_toolkit_install.info").write_text("version=8.3.RC1\n")
    assert build.cann_version(tmp_path) == (8, 3)
    assert build.bisheng_lang_flags((8, 3), "Ascend910B2") == ["-x", "asc", "--npu-arch=dav-2201"]
    assert build.bisheng_lang_flags(None, "Ascend910B3")[:2] == ["-x", "asc"]
    assert "--cce-auto-sync" not in build.bisheng_lang_flags((8, 5), "Ascend910B2")
    # the environment overrides the install info (a toolkit whose info file is missing or wrong)
    monkeypatch.setenv(build.CANN_VERSION_ENV, "8.1")
    assert build.cann_version(tmp_path) == (8, 1)
    monkeypatch.setenv(build.CANN_VERSION_ENV, "8.3.RC1")
    assert build.cann_version(tmp_path) == (8, 3)
    monkeypatch.setenv(build.CANN_VERSION_ENV, "eight")
    with pytest.raises(build.BuildError, match="SPLITKV_CANN_VERSION"):
        build.cann_version(tmp_path)
