"""The kit's variable names: the runtime spells the data root's, the contract the prefix."""

from trnfrontier.contract.kit import ENV_PREFIX, KNOBS
from trnfrontier.runtime.data_home import KIT_CACHE_DIR_ENV


def test_the_runtime_data_root_is_a_kit_variable() -> None:
    # The runtime may not import contract/, so it writes the name out in full; the prefix
    # it repeats must stay the contract's, or child_env stops forwarding the data root.
    assert KIT_CACHE_DIR_ENV.startswith(ENV_PREFIX)
    assert KIT_CACHE_DIR_ENV in KNOBS


def test_every_forwarded_knob_carries_the_prefix() -> None:
    assert all(name.startswith(ENV_PREFIX) for name in KNOBS)
