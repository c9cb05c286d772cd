"""Whether a layer may use its submodules' weights in a fused computation instead of calling them."""
from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _module


def plain_linears(*modules: nn.Module) -> bool:
    """Whether every one of ``modules`` is a plain ``nn.Linear`` (not a subclass, e.g. an adapter)
    and no forward hook would see its call: none of its own, none registered for every module
    (``nn.modules.module.register_module_forward_hook``). Else a layer calls them as modules."""
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return False
    return all(type(m) is nn.Linear and not (m._forward_hooks or m._forward_pre_hooks) for m in modules)
