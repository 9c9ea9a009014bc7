"""Shared test setup.

Without a GPU, :mod:`cuda_ref` switches Triton to its interpreter when it is imported, which only
works before anything else imports triton: import it first, whichever test module runs first.
"""

try:
    import cuda_ref  # noqa: F401
except ImportError:  # torch or triton missing: the Triton tests skip themselves
    pass
