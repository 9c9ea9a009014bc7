"""The parity tooling: every backend held to one reference by one rule.

* :mod:`.cases` — the named, seeded case catalog (and random inputs for tests);
* :mod:`.accuracy` — the accuracy rule (bounds against the float64 reference and the plain computation);
* :mod:`.registry` — :class:`~.registry.Backend` and discovery (``splitkv.backends`` entry points);
* :mod:`.backends` — the two backends that ship with ``splitkv_common``: ``numpy`` and ``torch``;
* :mod:`.harness` — runs cases on backends and reports (``splitkv parity``).

Nothing here is imported by ``import splitkv_common``; like the package, it needs only NumPy
(the ``torch`` backend imports torch when it runs).
"""
