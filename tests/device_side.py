"""A test helper: the operator's kernel as "the device side" of a host-read guard."""


def while_running(real, flag: list, value: bool):
    """``real`` wrapped so that ``flag[0]`` is ``value`` while it runs (then as it was): a guard that
    counts or refuses host reads of device tensors reads the flag to let the kernel's own reads by
    (the operator's CPU kernel stands in for the NPU, where they are device-side)."""
    def call(*a, **k):
        old, flag[0] = flag[0], value
        try:
            return real(*a, **k)
        finally:
            flag[0] = old
    return call
