"""The op folders' plumbing, read from the source: no import cycle in ``ppma.ops`` (imports inside
functions included), no file of an op folder imports its ``op.py``, and the registry's contract:
a kernel without a backward of its own gets the torch backward, and every op's gradients have
one layout, the op's ``backward_fake``."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import ppma.ops
from ppma.ops.registry import Impl, implementation, registered_ops

OPS_DIR = Path(ppma.ops.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(OPS_DIR.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in OPS_DIR.rglob("*.py")}


def imported_modules(name: str, path: Path) -> set[str]:
    """The ``ppma.ops`` modules that ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" for alias in node.names]
            found.update(t for t in targets if t in MODULES)
            if not any(t in MODULES for t in targets) and base in MODULES:
                found.add(base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in MODULES)
    return found - {name}


GRAPH = {name: imported_modules(name, path) for name, path in MODULES.items()}


def test_the_graph_sees_imports():
    assert "ppma.ops.registry" in GRAPH["ppma.ops.selective_scan_impl.op"]
    assert "ppma.ops.selective_scan_impl.cpu" in GRAPH["ppma.ops.selective_scan_impl.op"]


def test_no_import_cycle_in_ppma_ops():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target] if target in path else [name, target]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.endswith((".op", "__init__")) and n.count(".") == 3))
def test_no_op_folder_file_imports_its_op(name):
    folder = name.rpartition(".")[0]
    if folder == "ppma.ops":
        pytest.skip("not in an op folder")
    assert f"{folder}.op" not in GRAPH[name], f"{name} imports {folder}.op"


@pytest.mark.parametrize("name", sorted(registered_ops()))
def test_every_backend_has_a_backward(name):
    op = registered_ops()[name]
    for backend in ["torch"] + [k.backend for k in op.kernels if k.unavailable(torch.device("cpu")) is None]:
        impl = implementation(op, backend)
        assert isinstance(impl, Impl) and callable(impl.backward), (name, backend)
    assert callable(op.backward_fake)


def test_a_kernel_without_backward_gets_the_torch_backward():
    """selective_scan's cpu kernel has no backward of its own: its gradients are autograd's through
    the op's torch form, equal to the torch backend's."""
    op = registered_ops()["selective_scan"]
    torch.manual_seed(0)
    u, delta = torch.randn(1, 4, 7), torch.rand(1, 4, 7)
    A, B, C = -torch.rand(4, 2), torch.randn(1, 2, 7), torch.randn(1, 2, 7)
    args = (u, delta, A, B, C, None, None, None, True, torch.float32)
    grads = (torch.randn(1, 4, 7), torch.randn(1, 4, 2))
    got = implementation(op, "cpu").backward(grads, (), *args)
    want = implementation(op, "torch").backward(grads, (), *args)
    assert len(got) == 5
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    fakes = op.backward_fake(grads, (), *args)
    assert [(f.shape, f.dtype) for f in fakes] == [(g.shape, g.dtype) for g in got]
