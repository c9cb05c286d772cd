"""Whether a layer may use its submodules' weights in a fused computation instead of calling them."""
from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _module

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def plain_modules(cls: type, *modules: nn.Module) -> bool:
    """Whether every one of ``modules`` is of class ``cls`` itself (not a subclass, e.g. an adapter)
    and no hook would see its call, forward or backward: none of its own, none registered for
    every module (``nn.modules.module.register_module_forward_hook`` and the like). Else a layer
    calls them as modules."""
    if any(getattr(_module, f"_global{hooks}") for hooks in _HOOKS):
        return False
    return all(type(m) is cls and not any(getattr(m, hooks) for hooks in _HOOKS) for m in modules)


def plain_linears(*modules: nn.Module) -> bool:
    """:func:`plain_modules` of ``nn.Linear``."""
    return plain_modules(nn.Linear, *modules)
