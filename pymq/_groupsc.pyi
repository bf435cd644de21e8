"""Stub of the C module pymq._groupsc (pymq/_groupsc.c): the parent-death signal for
pymq.groups' broker processes.

Its Python twin (pymq.groups._die_with_parent_py) has the same signature, picked by
:func:`pymq.common.native.load_native` when this module is not built or PYMQ_PURE_PYTHON is set.
"""

def die_with_parent(signum: int, /) -> bool:
    """The calling process gets signum when its parent dies (Linux prctl PR_SET_PDEATHSIG);
    True, or False where the system has no such call."""
