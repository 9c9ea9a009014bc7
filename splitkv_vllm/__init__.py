"""vLLM / vLLM Ascend plugin: route decode-only attention batches through splitkv.

* :mod:`splitkv_vllm.plugin`: the ``vllm.general_plugins`` entry point (``register``), off unless
  switched on (``additional_config["splitkv"]["enable"]`` or ``SPLITKV_VLLM_ENABLE=1``).
* :mod:`splitkv_vllm.settings`: the settings (``additional_config["splitkv"]``, environment overrides).
* :mod:`splitkv_vllm.stats`: per-worker counters and how to collect them; :mod:`splitkv_vllm.log`: the
  ``vllm.splitkv_vllm`` logger; :mod:`splitkv_vllm.upstream`: the backend module and edits that would land the op in vLLM Ascend;
  :mod:`splitkv_vllm.window_check`: the node test that settles the sliding-window convention.
* :mod:`splitkv_vllm.adapter`: vLLM Ascend's attention metadata -> our plan and call (torch only).
* :mod:`splitkv_vllm.dispatch`: the one function that picks the implementation (the Ascend C
  operator on an NPU, the plain torch split-then-merge elsewhere).
* :mod:`splitkv_vllm.graph`: full-graph mode: graph-stable buffers refreshed in place before each
  replay.
* :mod:`splitkv_vllm.backend`: the attention backend subclass vLLM Ascend's platform hands out
  while the plugin is on (imports vLLM Ascend; loaded only by the platform).

``import splitkv_vllm`` (and ``plugin``, ``adapter``, ``dispatch``, ``graph``) needs neither vLLM, vLLM
Ascend, torch_npu nor CANN. See ``docs/vllm-ascend.md``.
"""

# The vLLM Ascend source whose metadata shapes and attention selection this package follows.
VLLM_ASCEND_REFERENCE = "vllm-project/vllm-ascend main @ 182b75ea (2026-08-22, after v0.19.1rc1)"
# Also read: the release 0.23.0.post1 (the tested range is splitkv_vllm.plugin.TESTED_VERSIONS).
