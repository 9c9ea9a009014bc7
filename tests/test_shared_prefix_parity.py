"""The shared-prefix parity catalog on every backend with a shared-prefix route here (numpy, torch,
triton through the interpreter): all pass; a backend without a route is reported unsupported."""

import pytest

from splitkv_common.parity.backends import numpy_backend
from splitkv_common.parity.cases import SHARED_PREFIX_CATALOG
from splitkv_common.parity.harness import FAIL, PASS, UNSUPPORTED
from splitkv_common.parity.registry import Backend, get_backend
from splitkv_common.parity.shared_prefix import run_shared_prefix_case, run_shared_prefix_parity


def test_catalog_covers_the_conventions():
    names = {c.name for c in SHARED_PREFIX_CATALOG}
    for want in ("two-groups", "window-inside-prefix", "soft-cap", "int8", "gqa3-multi-query", "page1"):
        assert any(want in n for n in names), want


@pytest.mark.parametrize("backend", ["numpy", "torch", "triton"])
def test_every_backend_passes_every_shared_prefix_case(backend):
    b = get_backend(backend)
    report = run_shared_prefix_parity([b])
    if backend in report.unavailable:
        pytest.skip(report.unavailable[backend])
    bad = [(r.case, r.status, r.message) for r in report.results if r.status != PASS]
    assert not bad and len(report.results) == len(SHARED_PREFIX_CATALOG)


def test_a_backend_without_a_route_is_unsupported_and_a_wrong_route_fails():
    case = SHARED_PREFIX_CATALOG[0]
    bare = Backend("bare", numpy_backend.run)
    assert run_shared_prefix_case(bare, case).status == UNSUPPORTED

    def halved(inputs, sp, **kw):
        out, lse = numpy_backend.extra["shared_prefix"](inputs, sp, **kw)
        return out * 0.5, lse

    assert run_shared_prefix_case(Backend("wrong", numpy_backend.run, extra={"shared_prefix": halved}), case).status == FAIL
