"""The one place where ppma widens ``torch.load(weights_only=True)``.

torch >= 2.6 unpickles checkpoints with ``weights_only=True`` by default and mmengine's loader
does not pass the argument, so resuming or testing a checkpoint written by training would fail
on the non-tensor objects it holds. Instead of disabling the safety check globally, we allow
exactly the plain-data objects these checkpoints contain:

- mmengine's ``HistoryBuffer`` (the message hub's logged scalars in ``meta``); it pickles its
  statistics methods as ``getattr(HistoryBuffer, 'mean')``, so ``builtins.getattr`` resolves to
  :func:`history_buffer_method`, which returns those methods and refuses everything else;
- numpy arrays, dtypes and scalars (values logged by hooks and metrics).

None of them runs code when unpickled beyond setting attributes or building arrays. (The
``argparse.Namespace`` of official classification checkpoints is allowed only while ppma reads
them, by :func:`ppma.models.checkpoint.allow_official_globals`: a global allowance would not last, as
torch's ``safe_globals`` context, which timm's loader uses too, removes it on exit.)
"""
import pickle

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

# HistoryBuffer's built-in statistics; custom ones join HistoryBuffer._statistics_methods.
DEFAULT_STATISTICS = ("mean", "max", "min", "current")


def history_buffer_method(obj, name: str):
    """``getattr`` as the unpickler may call it: only ``HistoryBuffer``'s statistics methods."""
    if obj is HistoryBuffer and (name in DEFAULT_STATISTICS or name in HistoryBuffer._statistics_methods):
        return getattr(obj, name)
    raise pickle.UnpicklingError(f"the checkpoint asks for getattr({obj!r}, {name!r}); ppma.mm only "
                                 "allows HistoryBuffer's statistics methods (see ppma/mm/serialization.py)")


def checkpoint_globals() -> list:
    """What :func:`allow_checkpoint_globals` registers (objects, or ``(object, pickled name)``)."""
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    numeric_dtypes = {type(np.dtype(code)) for code in np.typecodes["All"] if code not in "OV"}
    return [HistoryBuffer, (history_buffer_method, "builtins.getattr"),
            np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar,
            *sorted(numeric_dtypes, key=lambda cls: cls.__name__)]


def allow_checkpoint_globals() -> None:
    """Add :func:`checkpoint_globals` to ``torch.serialization``'s weights-only allow-list."""
    torch.serialization.add_safe_globals(checkpoint_globals())
