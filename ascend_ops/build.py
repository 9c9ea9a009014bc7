"""Build the operator's library, ``ascend_ops/_lib/libsplitkv_ascend.so`` (``scripts/build_ascend.sh``).

On a machine with CANN and torch_npu::

    python -m ascend_ops.build [--soc Ascend910B2] [--jobs N] [--build-dir build/ascend] [--route cmake|bisheng]

configures ``ascend_ops/csrc/CMakeLists.txt`` with the torch and torch_npu directories and the
torch C++ ABI, compiles the Ascend C kernels with CANN's ``ascendc_library()`` (bisheng) and the
binding against torch and torch_npu, and copies the library where :func:`ascend_ops.load_extension`
looks for it. ``--route bisheng`` instead compiles ``csrc/launch_split.asc``,
``csrc/launch_combine.asc`` and ``csrc/launch_attention_mix.asc`` (each: a kernel source and its
``<<<>>>`` launch function) with
``bisheng -x asc --npu-arch=dav-2201`` (CANN 8.3 and later: :func:`bisheng_lang_flags`) into
``libsplitkv_ascend_kernels.so``, then the binding with
the host compiler, linked to it. Every missing piece is reported in a sentence, with exit status 2.

The node-day probe kernels (``kernel/probes/``, ``scripts/npu_node_day.sh``), a library of their
own that the operator's build never includes::

    python -m ascend_ops.build --probes [--soc Ascend910B2] [--build-dir build/probes]

configures ``kernel/probes/CMakeLists.txt`` (CANN's ``ascendc_library()``, no torch) and copies
``libsplitkv_probes.so`` next to the operator's library.

Anywhere with a host C++ compiler and torch::

    python -m ascend_ops.build --offline-check

compiles ``binding.cpp`` against the real torch headers with stand-ins for the NPU-only headers
(``csrc/offline/``), loads the result in a fresh interpreter after ``ascend_ops.ops`` defined the
schema, and checks that the dispatcher accepted the C++ kernel for ``PrivateUse1``: a
signature that disagrees with :data:`ascend_ops.ops.SCHEMA` fails here instead of on a node.
``--torch-npu-headers torch_npu-<ver>-<tag>.whl`` also compiles it against that torch_npu
release's own headers (read from the wheel file; nothing is installed).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PKG = Path(__file__).resolve().parent
CSRC = PKG / "csrc"
KERNEL_DIR = PKG / "kernel"
LIB_DIR = PKG / "_lib"
LIB_FILE = "libsplitkv_ascend.so"
DEFAULT_SOC = "Ascend910B2"


class BuildError(RuntimeError):
    """A missing prerequisite or a failed step, said in a sentence."""


def cann_home() -> Path:
    """The CANN toolkit directory (``ASCEND_HOME_PATH``), or ``BuildError`` saying how to get it."""
    home = os.environ.get("ASCEND_HOME_PATH")
    if not home:
        raise BuildError("ASCEND_HOME_PATH is not set: install the CANN toolkit (8.1.RC1 or newer) and source "
                         "its set_env.sh (CANN's default: /usr/local/Ascend/ascend-toolkit/set_env.sh)")
    path = Path(home)
    if not path.is_dir():
        raise BuildError(f"ASCEND_HOME_PATH={home} is not a directory: "
                         "source the set_env.sh of an installed CANN toolkit")
    return path


def package_dir(name: str, hint: str) -> Path:
    """The directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"{name} is not installed: {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def torch_abi() -> int:
    import torch

    return int(torch._C._GLIBCXX_USE_CXX11_ABI)


def detect_soc(default: str = DEFAULT_SOC) -> str:
    """``SPLITKV_ASCEND_SOC``, else the name torch_npu reports for NPU 0 (e.g. ``Ascend910B2``), else ``default``."""
    env = os.environ.get("SPLITKV_ASCEND_SOC")
    if env:
        return env
    try:
        import torch_npu  # noqa: F401
        import torch

        name = torch.npu.get_device_name(0)
        if name.startswith("Ascend"):
            return name
    except Exception:  # noqa: BLE001 - detection is best effort; the default is said in the log
        pass
    return default


NPU_ARCH = {"Ascend910B": "dav-2201", "Ascend910_93": "dav-2201"}  # SoC name prefix -> bisheng --npu-arch
KERNELS_LIB_FILE = "libsplitkv_ascend_kernels.so"
#: The bisheng route's sources: each one kernel entry and its ``<<<>>>`` launch function.
LAUNCH_SOURCES = ("launch_split.asc", "launch_combine.asc", "launch_attention_mix.asc")


def npu_arch(soc: str) -> str:
    """bisheng's ``--npu-arch`` for a SoC name (``Ascend910B2`` -> ``dav-2201``)."""
    for prefix, arch in NPU_ARCH.items():
        if soc.startswith(prefix):
            return arch
    raise BuildError(f"SoC {soc!r}: the kernels are written for Ascend 910B (dav-2201); known prefixes: "
                     f"{', '.join(NPU_ARCH)}")


def _run(cmd: list[str], log) -> None:
    log("+ " + " ".join(cmd))
    if subprocess.run(cmd).returncode:
        raise BuildError(f"'{' '.join(cmd[:3])}' failed (see the messages above)")


def node_build(soc: str | None = None, build_dir: Path | None = None, jobs: int | None = None,
               log=print, route: str = "cmake") -> Path:
    """Compile the kernels and the binding and put the library in the package; return its path.

    ``route``: ``cmake`` (CANN's ``ascendc_library()``, the default) or ``bisheng`` (``bisheng -x
    asc`` on ``csrc/launch_*.asc``, kernel and ``<<<>>>`` launch in one file each, then the host
    compiler on ``binding.cpp``). ``BuildError`` says what is missing or which step failed.
    """
    home = cann_home()
    torch_dir = package_dir("torch", "pip install torch (the version torch_npu was built for)")
    npu_dir = package_dir("torch_npu", "install the torch-npu wheel matching your torch and CANN (docs/npu.md)")
    if not (npu_dir / "include").is_dir():
        raise BuildError(f"torch_npu at {npu_dir} has no include/ directory: reinstall the torch-npu wheel")
    if not list(KERNEL_DIR.glob("*.cpp")):
        raise BuildError(f"no kernel sources in {KERNEL_DIR}")
    soc = soc or detect_soc()
    build_dir = Path(build_dir or Path.cwd() / "build" / "ascend")
    build_dir.mkdir(parents=True, exist_ok=True)
    if route == "cmake":
        built = _cmake_build(home, torch_dir, npu_dir, soc, build_dir, jobs, log)
        extra = []
    elif route == "bisheng":
        built, kernels = _bisheng_build(home, torch_dir, npu_dir, soc, build_dir, log)
        extra = [kernels]
    else:
        raise BuildError(f"route {route!r}: expected cmake or bisheng")
    LIB_DIR.mkdir(exist_ok=True)
    for lib in extra:
        shutil.copy2(lib, LIB_DIR / lib.name)
    dest = LIB_DIR / LIB_FILE
    shutil.copy2(built, dest)
    log(f"built {dest} for {soc} ({route} route)")
    return dest


def _cmake_build(home, torch_dir, npu_dir, soc, build_dir, jobs, log) -> Path:
    if shutil.which("cmake") is None:
        raise BuildError("cmake is not on PATH (3.16 or newer is needed)")
    _run(["cmake", "-S", str(CSRC), "-B", str(build_dir), f"-DSOC_VERSION={soc}",
          f"-DASCEND_CANN_PACKAGE_PATH={home}", f"-DTORCH_PATH={torch_dir}", f"-DTORCH_NPU_PATH={npu_dir}",
          f"-DTORCH_CXX11_ABI={torch_abi()}", "-DCMAKE_BUILD_TYPE=Release",
          f"-DSPLITKV_EXTRA_LIBS={os.environ.get('SPLITKV_EXTRA_LIBS', '')}"], log)
    _run(["cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 4)], log)
    built = sorted(build_dir.rglob(LIB_FILE))
    if not built:
        raise BuildError(f"the build finished but produced no {LIB_FILE} under {build_dir}")
    return built[0]


CANN_VERSION_ENV = "SPLITKV_CANN_VERSION"  # e.g. 8.1: overrides the toolkit's install info


def cann_version(home: Path) -> tuple[int, int] | None:
    """(major, minor) of the CANN toolkit at ``home``: ``SPLITKV_CANN_VERSION`` (``8.1``, ``8.3.RC1``)
    when set, else its ``ascend_toolkit_install.info`` (``version=8.1.RC1``, in the toolkit root or
    its ``<arch>-linux`` folder); None if neither says."""
    forced = os.environ.get(CANN_VERSION_ENV, "").strip()
    if forced:
        m = re.match(r"(\d+)\.(\d+)", forced)
        if not m:
            raise BuildError(f"{CANN_VERSION_ENV}={forced!r}: expected <major>.<minor>, e.g. 8.1 or 8.3.RC1")
        return int(m.group(1)), int(m.group(2))
    home = Path(home)
    for info in [home / "ascend_toolkit_install.info", *sorted(home.glob("*-linux/ascend_toolkit_install.info"))]:
        if info.is_file():
            m = re.search(r"^version=(\d+)\.(\d+)", info.read_text(errors="replace"), re.M)
            if m:
                return int(m.group(1)), int(m.group(2))
    return None


#: The first CANN release whose bisheng builds a mixed (AIC + AIV) kernel in one call.
BISHENG_MIN_CANN = (8, 3)


def bisheng_lang_flags(version: tuple[int, int] | None, soc: str) -> list[str]:
    """bisheng's language / target flags for the installed CANN: ``-x asc --npu-arch=dav-2201``, the
    Ascend C language mode of the BiSheng compiler docs ("Compilation Using BiSheng Command Lines"),
    CANN 8.3 and later (and an unknown version).

    CANN 8.1 / 8.2 are refused (``BuildError``): there a direct bisheng call compiles one core type,
    while the mixed kernel needs a cube pass (``--cce-aicore-arch=dav-c220-cube``) and a vector pass
    (``dav-c220-vec``) merged into one mixed object, which only CANN's ``ascendc_library()`` does
    (8.1 ``tikcpp/ascendc_kernel_cmake/bisheng_intf.cmake``: ``aic_intf_pub`` / ``aiv_intf_pub``;
    ``util/merge_mix_obj.sh``): a vector-only binary would hang at the first cross-core wait.

    NOT RUN: no CANN toolkit was available to try the 8.3 spelling."""
    if version is not None and version < BISHENG_MIN_CANN:
        raise BuildError(f"route bisheng: CANN {version[0]}.{version[1]} has no one-call build of the mixed AIC + AIV "
                         "kernel (its ascendc_library() compiles a dav-c220-cube and a dav-c220-vec pass and merges "
                         "them); use the default cmake route there, or CANN 8.3 or later")
    return ["-x", "asc", f"--npu-arch={npu_arch(soc)}"]


def _bisheng_build(home, torch_dir, npu_dir, soc, build_dir, log) -> tuple[Path, Path]:
    bisheng = shutil.which("bisheng") or str(home / "compiler" / "ccec_compiler" / "bin" / "bisheng")
    if not Path(bisheng).is_file():
        raise BuildError("bisheng not found on PATH nor under $ASCEND_HOME_PATH/compiler/ccec_compiler/bin")
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise BuildError("no host C++ compiler (g++ or clang++) on PATH")
    kernels = build_dir / KERNELS_LIB_FILE
    version = cann_version(home)
    log(f"CANN {'.'.join(map(str, version)) if version else 'version unknown'}: bisheng "
        f"{' '.join(bisheng_lang_flags(version, soc))}")
    _run([bisheng, *bisheng_lang_flags(version, soc), "-shared", "-fPIC", "-O2", "-std=c++17",
          f"-I{KERNEL_DIR}", f"-I{CSRC / 'launch'}", f"-I{home / 'include'}",
          *[str(CSRC / f) for f in LAUNCH_SOURCES], "-o", str(kernels)], log)
    out = build_dir / LIB_FILE
    torch_inc = torch_dir / "include"
    libs = [f"-L{build_dir}", f"-L{torch_dir / 'lib'}", f"-L{npu_dir / 'lib'}", f"-L{home / 'lib64'}",
            "-lsplitkv_ascend_kernels", "-ltorch_npu", "-ltorch", "-ltorch_cpu", "-lc10", "-lascendcl", "-ldl",
            *[f"-l{x}" for x in os.environ.get("SPLITKV_EXTRA_LIBS", "").split(";") if x]]
    _run([cxx, "-std=c++17", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
          f"-D_GLIBCXX_USE_CXX11_ABI={torch_abi()}", f"-isystem{torch_inc}",
          f"-isystem{torch_inc / 'torch' / 'csrc' / 'api' / 'include'}", f"-isystem{npu_dir / 'include'}",
          f"-isystem{home / 'include'}", f"-I{CSRC / 'launch'}", f"-I{KERNEL_DIR}", str(CSRC / "binding.cpp"),
          *libs, f"-Wl,-rpath,$ORIGIN:{torch_dir / 'lib'}:{npu_dir / 'lib'}", "-o", str(out)], log)
    return out, kernels


# --- the node-day probe library ----------------------------------------------------------

PROBE_DIR = KERNEL_DIR / "probes"
PROBE_LIB_FILE = "libsplitkv_probes.so"


def probe_build(soc: str | None = None, build_dir: Path | None = None, jobs: int | None = None,
                log=print) -> Path:
    """Compile the node-day probe kernels (``kernel/probes/*.cpp``) with CANN's ``ascendc_library()``
    into ``libsplitkv_probes.so`` (their ``aclrtlaunch_<kernel>`` functions), copy it into the
    package and return its path. Needs CANN and cmake, not torch. NOT RUN with a real toolkit."""
    home = cann_home()
    if shutil.which("cmake") is None:
        raise BuildError("cmake is not on PATH (3.16 or newer is needed)")
    soc = soc or detect_soc()
    npu_arch(soc)  # a SoC the kernels are not written for is refused here
    build_dir = Path(build_dir or Path.cwd() / "build" / "probes")
    build_dir.mkdir(parents=True, exist_ok=True)
    _run(["cmake", "-S", str(PROBE_DIR), "-B", str(build_dir), f"-DSOC_VERSION={soc}",
          f"-DASCEND_CANN_PACKAGE_PATH={home}", "-DCMAKE_BUILD_TYPE=Release"], log)
    _run(["cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 4)], log)
    built = sorted(build_dir.rglob(PROBE_LIB_FILE))
    if not built:
        raise BuildError(f"the probe build finished but produced no {PROBE_LIB_FILE} under {build_dir}")
    LIB_DIR.mkdir(exist_ok=True)
    dest = LIB_DIR / PROBE_LIB_FILE
    shutil.copy2(built[0], dest)
    log(f"built {dest} for {soc} (node-day probes)")
    return dest


# --- offline check --------------------------------------------------------------------------

_LOAD_CHECK = """
import sys, torch
import ascend_ops.ops as ops
import ascend_ops.runtime as runtime
assert not runtime.has_npu_kernel()
torch.ops.load_library(sys.argv[1])
assert runtime.has_npu_kernel(), "the library registered no PrivateUse1 kernel"
print("ok: the C++ kernel matches", ops.QUALNAME, "and is registered for PrivateUse1")
"""


def offline_library(out_dir: Path, cxx: str | None = None, log=print) -> Path:
    """Compile ``binding.cpp`` + the offline stand-ins into a CPU-only library in ``out_dir``."""
    import torch.utils.cpp_extension as ext

    cxx = cxx or os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise BuildError("no host C++ compiler (g++ or clang++) on PATH")
    torch_lib = Path(ext.include_paths()[0]).parent / "lib"
    out = Path(out_dir) / "libsplitkv_ascend_offline.so"
    cmd = [cxx, "-std=c++17", "-shared", "-fPIC", "-O0", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
           f"-D_GLIBCXX_USE_CXX11_ABI={torch_abi()}",
           *[f"-isystem{p}" for p in ext.include_paths()], f"-I{CSRC / 'offline'}", f"-I{CSRC / 'launch'}",
           f"-I{KERNEL_DIR}",
           str(CSRC / "binding.cpp"), str(CSRC / "offline" / "stub_runtime.cpp"),
           f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}", "-o", str(out)]
    log("+ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise BuildError(f"binding.cpp does not compile against the torch headers:\n{r.stderr[-4000:]}")
    return out


def load_check(lib: Path) -> str:
    """Load ``lib`` in a fresh interpreter after ``ascend_ops.ops`` defined the schema (a mismatch
    aborts that interpreter, not this one); return its message or raise ``BuildError``. Meant for
    the offline and stand-in builds: torch_npu is not imported in that interpreter."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PKG.parent), os.environ.get("PYTHONPATH", "")]))
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # stand-in builds: keep a real torch_npu (if any) out
    r = subprocess.run([sys.executable, "-c", _LOAD_CHECK, str(lib)], capture_output=True, text=True, env=env)
    if r.returncode:
        msg = "\n".join(x for x in (r.stderr or r.stdout).splitlines() if not x.startswith("frame #"))
        raise BuildError("loading the binding against ascend_ops.ops.SCHEMA failed:\n" + msg[:4000])
    return r.stdout.strip()


def offline_check(out_dir: Path | None = None, log=print) -> str:
    """Compile the binding offline and load it against the Python schema; return the loader's message."""
    with tempfile.TemporaryDirectory() as tmp:
        return load_check(offline_library(Path(out_dir or tmp), log=log))


def torch_npu_headers_check(wheel_or_include: Path, cxx: str | None = None, log=print) -> str:
    """Compile ``binding.cpp`` (syntax and types) against a torch_npu release's own headers.

    ``wheel_or_include``: a torch-npu wheel (only its ``torch_npu/include`` is read; nothing is
    installed or imported) or an extracted ``include`` directory. Only the two generated launch
    headers' declarations come from ``csrc/launch``. Use the torch_npu release that matches the
    installed torch.
    """
    import zipfile

    import torch.utils.cpp_extension as ext

    cxx = cxx or os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise BuildError("no host C++ compiler (g++ or clang++) on PATH")
    src = Path(wheel_or_include)
    with tempfile.TemporaryDirectory() as tmp:
        if src.is_file():
            with zipfile.ZipFile(src) as z:
                members = [n for n in z.namelist() if n.startswith("torch_npu/include/")]
                if not members:
                    raise BuildError(f"{src} holds no torch_npu/include/: not a torch-npu wheel?")
                z.extractall(tmp, members=members)
            inc = Path(tmp) / "torch_npu" / "include"
        else:
            inc = src
        if not (inc / "torch_npu" / "csrc" / "framework" / "OpCommand.h").is_file():
            raise BuildError(f"{inc} has no torch_npu/csrc/framework/OpCommand.h")
        cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
               f"-D_GLIBCXX_USE_CXX11_ABI={torch_abi()}", *[f"-isystem{p}" for p in ext.include_paths()],
               f"-isystem{inc}", f"-isystem{inc / 'third_party' / 'acl' / 'inc'}",
               f"-I{CSRC / 'launch'}", f"-I{KERNEL_DIR}", str(CSRC / "binding.cpp")]
        log("+ " + " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise BuildError(f"binding.cpp does not compile against the torch_npu headers of {src}:\n"
                             + r.stderr[-4000:])
    return f"ok: binding.cpp compiles against the torch_npu headers of {src.name}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ascend_ops.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--soc", help=f"SoC for the kernels (default: detected, else {DEFAULT_SOC})")
    ap.add_argument("--build-dir", type=Path, help="cmake build directory (default: ./build/ascend)")
    ap.add_argument("--jobs", type=int, help="parallel compile jobs")
    ap.add_argument("--route", choices=("cmake", "bisheng"), default="cmake",
                    help="cmake: CANN's ascendc_library() (default); bisheng: bisheng -x asc on csrc/launch_*.asc")
    ap.add_argument("--probes", action="store_true",
                    help="build the node-day probe kernels (kernel/probes/) into libsplitkv_probes.so instead")
    ap.add_argument("--offline-check", action="store_true",
                    help="no CANN needed: compile binding.cpp with stand-in NPU headers, check it against the schema")
    ap.add_argument("--torch-npu-headers", type=Path, metavar="WHEEL_OR_DIR",
                    help="with --offline-check: also compile binding.cpp against this torch-npu wheel's own headers")
    args = ap.parse_args(argv)
    try:
        if args.offline_check:
            print(offline_check())
            if args.torch_npu_headers:
                print(torch_npu_headers_check(args.torch_npu_headers))
        elif args.probes:
            probe_build(args.soc, args.build_dir, args.jobs)
        else:
            node_build(args.soc, args.build_dir, args.jobs, route=args.route)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
