"""The twin and the kernel sources under a second compiler and under AddressSanitizer + UBSan.

Undefined behaviour in the twin or in the kernel sources (which bisheng optimises too) shows as
results that change with the compiler and its flags. Each toolchain below rebuilds every twin library (its own cache) and reruns the twin's tests in a child
pytest:

* ``clang``: the twin tests at the default -O2 with clang++ (the system's default compiler is
  what the rest of the suite uses);
* ``sanitizers``: g++ with ``-O1 -fsanitize=address,undefined`` (undefined behaviour is fatal; -O1,
  the sanitizers' usual level, builds faster than -O2), the sanitizer runtimes preloaded into the
  child Python.

A toolchain may link the C++ runtime statically into a shared library (g++ 13 on Ubuntu 24.04 did):
the twin then crashed in its first ``std::ostringstream`` at every optimisation level, because the
runtime's symbols were exported and bound half to the process's own libstdc++.so. The twin's link
keeps archives' symbols private; ``test_a_static_cxx_runtime_stays_private`` checks it.

A toolchain this machine lacks skips with the reason, unless ``SPLITKV_TWIN_TOOLCHAINS=required``
(CI sets it and installs clang), where a skip is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sim = pytest.importorskip("ascend_ops.sim_backend")

from toolchains import missing, sanitizer_runtime  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TWIN_TESTS = ["tests/ascend/test_twin_pipes.py", "tests/ascend/test_twin_cube.py", "tests/ascend/test_twin_cube_rules.py",
              "tests/ascend/test_sim_rules.py", "tests/ascend/test_sim.py", "tests/ascend/test_sim_mix.py",
              "tests/ascend/test_sim_mix_int8.py", "tests/ascend/test_graph_mode.py"]
# under the sanitizers (several times slower): the rules and the small catalog on both kernels
SANITIZED_TESTS = ["tests/ascend/test_twin_pipes.py", "tests/ascend/test_twin_cube.py",
                   "tests/ascend/test_twin_cube_rules.py", "tests/ascend/test_sim_rules.py", "tests/ascend/test_sim.py"]


def _clang() -> str | None:
    for name in ("clang++", *(f"clang++-{v}" for v in range(22, 13, -1))):
        if shutil.which(name):
            return name
    return None


class Child:
    """One child pytest over ``tests`` with ``env_extra``; started at once, judged by ``check``."""

    def __init__(self, tmp_path, env_extra: dict, tests: list[str], timeout: int):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SPLITKV_SIM_", "LD_PRELOAD", "ASAN_", "UBSAN_"))}
        env.update(SPLITKV_SIM_CACHE=str(tmp_path / "cache"), PYTHONFAULTHANDLER="1", **env_extra)
        self.cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow", *tests]
        self.env_extra, self.timeout = env_extra, timeout
        self.log = tmp_path / "log.txt"
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)

    def check(self):
        try:
            rc = self.proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "timeout"
        out = self.log.read_text(errors="replace")
        assert rc == 0, f"{' '.join(self.cmd)} with {self.env_extra}: exit {rc}\n{out[-6000:]}"
        assert " passed" in out, out[-6000:]


def _clang_child(tmp_path):
    cxx = _clang()
    if cxx is None:
        return "no clang++ on PATH (Debian/Ubuntu: apt-get install clang)"
    return Child(tmp_path, {"CXX": cxx}, TWIN_TESTS, timeout=1500)


def _sanitizer_child(tmp_path):
    cxx = os.environ.get("CXX", "g++")
    asan, ubsan = sanitizer_runtime(cxx, "libasan.so"), sanitizer_runtime(cxx, "libubsan.so")
    if not (asan and ubsan):
        return f"{cxx} ships no libasan.so / libubsan.so (Debian/Ubuntu: they come with g++)"
    flags = "-O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    return Child(tmp_path, {"CXX": cxx, "SPLITKV_SIM_CXXFLAGS": flags, "LD_PRELOAD": f"{asan}:{ubsan}",
                            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
                            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}, SANITIZED_TESTS, timeout=2400)


@pytest.fixture(scope="module")
def children(tmp_path_factory):
    """Both toolchains' children, started together (they run side by side on two cores)."""
    kids = {"clang": _clang_child(tmp_path_factory.mktemp("clang")),
            "sanitizers": _sanitizer_child(tmp_path_factory.mktemp("sanitizers"))}
    yield kids
    for kid in kids.values():
        if isinstance(kid, Child) and kid.proc.poll() is None:
            kid.proc.kill()


@pytest.mark.parametrize("toolchain", ["clang", "sanitizers"])
def test_twin_tests_pass_under_the_toolchain(children, toolchain):
    kid = children[toolchain]
    if isinstance(kid, str):
        missing(kid)
    kid.check()


def test_a_static_cxx_runtime_stays_private(tmp_path):
    """Linked with ``-static-libstdc++``, the twin exports its own C entry points and nothing else
    strong: no ``std::`` runtime symbol another libstdc++ in the process could bind to or interpose.
    Then it runs a kernel (its launcher formats statistics through ``std::ostringstream``)."""
    if shutil.which("nm") is None:
        missing("no nm on PATH (binutils)")
    lib = sim.build_library(sorted(sim.KERNEL_DIR.glob("*.cpp")), defines=("SPLITKV_SIM_KERNELS",),
                            name="static-runtime", extra_flags=("-static-libstdc++",))
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    strong = sorted({f[2] for f in map(str.split, out.splitlines()) if len(f) == 3 and f[1] in "TDBR"})
    assert strong and all(s.startswith(("sim_", "splitkv_")) for s in strong), strong[:20]
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "libstdc++" not in needed  # the flag took: the runtime is inside
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPLITKV_SIM_", "LD_PRELOAD"))}
    env.update(SPLITKV_SIM_LDFLAGS="-static-libstdc++", SPLITKV_SIM_CACHE=str(tmp_path), PYTHONFAULTHANDLER="1")
    res = subprocess.run([sys.executable, "-c", _ONE_CASE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and "error" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]
    assert float(res.stdout.split()[-1]) < 1e-5, res.stdout


_ONE_CASE = """
import numpy as np
from ascend_ops import sim_backend as sim
from splitkv_common.parity.cases import random_inputs
from splitkv_common.reference import dense_attention
inp = random_inputs(0, seq_lens=[54, 7, 0], num_q_heads=4, num_kv_heads=4, head_dim=64, dtype="float32")
out, lse = sim.run_twin(inp, inp.plan("auto", device="910b2"))
print("max abs error", float(np.nanmax(np.abs(out - dense_attention(inp)[0]))))
"""
