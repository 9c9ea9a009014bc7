"""The C++ call guard (``cuda_ref/call_guard.cpp``) under AddressSanitizer and UndefinedBehaviorSanitizer:
built with ``-fsanitize=address,undefined`` and driven, in a Python process with the runtimes preloaded,
by hostile arguments (every slot replaced by sparse, nested, meta, 0-d and transposed tensors, None,
ints past 64 bits, strings, objects; too few and too many arguments, keywords; bad constructor
arguments), by a guard outliving its tensor's subclass, and by many guards made and dropped. Any report fails the test (``halt_on_error``).

Skips where the C++ compiler or its sanitizer runtimes are missing, unless ``SPLITKV_TWIN_TOOLCHAINS=required``
(CI), where that is a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_ref import checks  # noqa: E402
from toolchains import missing, sanitizer_runtime  # noqa: E402

DRIVER = textwrap.dedent("""
    import gc, sys
    import torch
    sys.path.insert(0, sys.argv[1])
    import _splitkv_guard as G
    from cuda_ref import checks
    assert checks._self_test(G.CallGuard)
    a = torch.randn(2, 3)
    odd = [a.to_sparse(), a.as_subclass(torch.Tensor), a.to("meta"), a.reshape(-1)[0], a.t(), None, 3, "x",
           object(), torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(4, 3)], layout=torch.jagged),
           2 ** 70, -1.5, float("inf"), float("nan")]
    for n in range(4):
        for args in [(a,) * n + (0.5, None, 7), (None,) * n + (1,), (a,) * n]:
            try:
                g = G.CallGuard(n, *args)
            except TypeError:
                continue
            for o in odd:
                for pos in range(len(args)):
                    x = list(args)
                    x[pos] = o
                    g(*x)
                    g(*x[:-1])
                    g(*x, o)
            try:
                g(*args, k=1)
            except TypeError:
                pass
    for bad in [(), ("x",), (-1, a), (5, a), (1, 3), (1, a.to_sparse()), (2 ** 70, a)]:
        try:
            G.CallGuard(*bad)
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            raise AssertionError(f"CallGuard{bad!r} was made")
    def subclass_guard():   # a guard outliving every other reference to its tensor's type
        T = type("T", (torch.Tensor,), {})
        return G.CallGuard(1, a.as_subclass(T))
    g = subclass_guard()
    gc.collect()
    assert not g(a) and not g(a.as_subclass(type("U", (torch.Tensor,), {})))
    del g
    gc.collect()
    for _ in range(2000):
        g = G.CallGuard(2, a, None, 0.5, 2 ** 80)
        assert g(a, None, 0.5, 2 ** 80)
        del g
    gc.collect()
    print("sanitized guard ok")
""")


def test_the_call_guard_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        missing(f"no C++ compiler ({cxx})")
    runtimes = [sanitizer_runtime(cxx, name) for name in ("libasan.so", "libubsan.so")]
    if None in runtimes:
        missing(f"{cxx} lacks libasan.so or libubsan.so")
    args = [a for a in checks._guard_build_args() if a not in ("-O2", "-w")]
    target = tmp_path / f"_splitkv_guard{sysconfig.get_config_var('EXT_SUFFIX')}"
    build = subprocess.run([cxx, str(checks._GUARD_SOURCE), "-o", str(target), *args, "-O1", "-g", "-w",
                            "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                            "-fno-omit-frame-pointer"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    env = dict(os.environ, LD_PRELOAD=" ".join(runtimes),
               ASAN_OPTIONS="detect_leaks=0:halt_on_error=1", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0 and "sanitized guard ok" in run.stdout, (run.stdout[-2000:], run.stderr[-4000:])
    assert "ERROR: AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, run.stderr[-4000:]
