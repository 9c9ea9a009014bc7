"""splitkv_common: the one definition of split-KV decode attention (NumPy only).

* :mod:`.states` — the ``(o, lse)`` state (natural-log lse) and converters to other formats;
* :mod:`.merge` — the exact merge of states;
* :mod:`.plan`, :mod:`.devices` — the split planner and the device profiles it decides from;
* :mod:`.inputs`, :mod:`.validation` — the decode problem as data and the shared input checks;
* :mod:`.reference` — float64 dense ground truth and the float32 split-then-merge reference;
* :mod:`.dtypes` — low-precision dtypes in NumPy; :mod:`.explain` — the seed's worked example;
* :mod:`.torch_eager` — the same computation with stock PyTorch ops (needs torch);
* :mod:`.torch_io` — dtype names <-> torch dtypes, cases <-> torch tensors (needs torch);
* :mod:`.parity` — the parity tooling: case catalog, accuracy rule, backend registry, harness;
* :mod:`.cli` — the ``splitkv`` command (``explain``, ``plan``, ``parity``, ``backends``).
"""

from .devices import PROFILES, DeviceProfile, get_profile
from .inputs import DecodeInputs
from .merge import merge_pair, merge_rows, merge_states
from .plan_layout import Plan
from .plan_spec import PlanSpec
from .planner import make_plan
from .policies import SplitPolicy
from .states import (canonical_lse, ifa_to_state, lse_from_base2, lse_to_base2, mlu_to_state, state_to_ifa,
                     state_to_mlu)
from .validation import check_decode_args

__all__ = [
    "PROFILES", "DeviceProfile", "get_profile", "DecodeInputs", "merge_pair", "merge_rows", "merge_states",
    "Plan", "PlanSpec", "SplitPolicy", "make_plan", "canonical_lse", "ifa_to_state", "lse_from_base2", "lse_to_base2",
    "mlu_to_state", "state_to_ifa", "state_to_mlu", "check_decode_args",
]
__version__ = "0.1.0"
