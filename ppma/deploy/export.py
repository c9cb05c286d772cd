"""Export a preset of this package to ONNX or to a ``torch.export`` program (``.pt2``), with batch,
height and width dynamic, and check it against eager PyTorch.

    python tools/export.py --model NAME [--checkpoint FILE] [--features] --format onnx|pt2
                           --output OUT [--img-size H W] [--batch-size N] [--opset N] [--no-optimize]
                           [--verify]
    python tools/export.py --model test_ppma test_vim ... --format onnx --output DIR --verify
    python tools/export.py --config MMDET_OR_MMSEG_CONFIG [--checkpoint FILE] --format onnx ...

``--checkpoint``: any checkpoint the presets load (official, converted, or written by
``tools/train.py``), through the family's strict conversion. ``--features``: the
``features_only`` backbone (its four stride 4/8/16/32 maps, in order). ``--img-size`` /
``--batch-size``: the example input only (default: the preset's size, batch 2; torch.export
fixes sizes 0 and 1, so the example batch must be >= 2 and every stride-32 map at least 2 wide:
H, W >= 33); the exported graph runs at any batch size and any H, W >= 33 (Vim: any size its
patch embedding accepts; its position embedding is resized as in eager). Every ``ppma::`` op
becomes its export form (``ppma.ops.registry.export_decompositions``).

``--config``: the backbone and neck of a detector (mmdet) or the backbone of a segmentor (mmseg)
of that config, with a ``tools/train.py`` checkpoint (strict); the file returns the neck's maps
(FPN: five) or the backbone's four. The rest (RPN proposals, RoI heads, UPerNet's pooling
pyramid) is not exported: see docs/deploy.md.

``--verify`` runs the file (ONNX Runtime, or ``torch.export.load``) at the example size and at
two others (batch 1 at 97x131, and batch + 1 at H + 32 x W + 16), prints the max relative error
of every output against eager PyTorch and exits 1 above 1e-4. Several ``--model`` names export
each into the ``--output`` folder (``NAME[_features].onnx|.pt2``) and print one line per model;
so does one name when ``--output`` is an existing folder or ends in ``/``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

TOLERANCE = 1e-4
MIN_OPSET = 18  # torch.onnx's dynamo exporter emits opset 18 ops (e.g. antialiased Resize)
DEFAULT_OPSET = 18


def build_model(name: str, checkpoint: str | None = None, features: bool = False) -> torch.nn.Module:
    """The preset ``name`` of this package in eval mode, with ``checkpoint``'s weights (strict)."""
    import timm

    from ppma.models.family import create_from_checkpoint, family_of

    family_of(name)  # ValueError naming our models when ``name`` is not one
    kwargs = dict(features_only=True) if features else {}
    if checkpoint is None:
        return timm.create_model(name, **kwargs).eval()
    from ppma.models.checkpoint import read_checkpoint

    try:
        return create_from_checkpoint(name, read_checkpoint(checkpoint), **kwargs).eval()
    except ValueError as err:
        raise ValueError(f"checkpoint {checkpoint} does not fit {name}: {err}") from err


class DenseFeatures(torch.nn.Module):
    """The backbone (and neck, if any) of an mmdet/mmseg model: ``(B, 3, H, W)`` -> its maps."""

    def __init__(self, model: torch.nn.Module, input_size=(3, 256, 320)):
        super().__init__()
        self.backbone, self.neck = model.backbone, getattr(model, "neck", None)
        self.pretrained_cfg = {"input_size": input_size}  # the default example (example_input)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feats = self.backbone(x)
        return tuple(self.neck(feats) if self.neck is not None else feats)


def build_dense(config: str, checkpoint: str | None = None) -> DenseFeatures:
    """The backbone (+ neck) of ``config``'s model in eval mode, with ``checkpoint`` (strict)."""
    from ppma.mm.analysis import build_model as build_mm_model
    from ppma.mm.runtime import load_config

    if not Path(config).is_file():
        raise FileNotFoundError(f"config not found: {config}")
    return DenseFeatures(build_mm_model(load_config(config), checkpoint)).eval()


def example_input(model: torch.nn.Module, img_size=None, batch_size: int = 2) -> torch.Tensor:
    """Random ``(batch, C, [T,] H, W)`` example; ``img_size`` ``(H, W)`` overrides the preset's."""
    if batch_size < 2:
        raise ValueError(f"--batch-size {batch_size}: torch.export fixes a batch of 1; export with >= 2 "
                         f"(the exported graph runs at batch 1 too)")
    size = list(model.pretrained_cfg["input_size"])
    if img_size is not None:
        size[-2:] = img_size
    if min(size[-2:]) < 33:
        raise ValueError(f"example size {tuple(size[-2:])}: H and W must be >= 33 (a 1-wide stride-32 map "
                         f"would be fixed by torch.export)")
    return torch.randn(batch_size, *size, generator=torch.Generator().manual_seed(0))


def export_program(model: torch.nn.Module, x: torch.Tensor) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` at ``x`` with batch, H and W dynamic, every ``ppma::`` op
    decomposed into its export form (plain ATen ops)."""
    from ppma.ops.registry import export_decompositions

    dynamic = torch.export.Dim.DYNAMIC
    shapes = ({0: dynamic, x.dim() - 2: dynamic, x.dim() - 1: dynamic},)
    with torch.no_grad():
        program = torch.export.export(model, (x,), dynamic_shapes=shapes)
    return program.run_decompositions({**torch.export.default_decompositions(), **export_decompositions()})


def save(program: torch.export.ExportedProgram, x: torch.Tensor, fmt: str, output: Path, opset: int,
         optimize: bool = True) -> None:
    """Write ``program`` as ``.pt2`` or ONNX (``opset``) to ``output``. ``optimize``: run the ONNX
    exporter's graph optimizer (onnxscript's rewriter and constant folding); without it the
    export takes about half the time and ONNX Runtime still optimizes the graph when it loads it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "pt2":
        torch.export.save(program, str(output))
        return
    if opset < MIN_OPSET:
        raise ValueError(f"--opset {opset} is too old: the export needs opset >= {MIN_OPSET} "
                         f"(bicubic antialiased Resize, and torch.onnx's dynamo exporter)")
    with torch.no_grad():  # the exporter reruns the graph; selective_scan's scan has no symbolic autograd
        onnx_program = torch.onnx.export(program, (x,), dynamo=True, opset_version=opset, optimize=optimize,
                                         verbose=False)
    onnx_program.save(str(output))


def runner(fmt: str, output: Path):
    """``run(x) -> list of outputs`` of the exported file."""
    if fmt == "pt2":
        module = torch.export.load(str(output)).module()
        return lambda x: _as_list(module(x))
    session = onnxruntime_session(output)
    name = session.get_inputs()[0].name
    return lambda x: [torch.from_numpy(o) for o in session.run(None, {name: x.numpy()})]


def onnxruntime_session(path: Path, threads: int | None = None):
    """An ONNX Runtime session of the file ``path`` on the CPU execution provider; ``threads``:
    its intra-op threads (one inter-op thread), else ONNX Runtime's defaults."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _as_list(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def verify_sizes(x: torch.Tensor) -> list[tuple[int, ...]]:
    """The example's shape, batch 1 at 97x131, and batch + 1 at (H + 32, W + 16)."""
    batch, *rest = x.shape
    return [tuple(x.shape), (1, *rest[:-2], 97, 131), (batch + 1, *rest[:-2], rest[-2] + 32, rest[-1] + 16)]


def max_relative_error(model: torch.nn.Module, run, shape) -> float:
    """Max over outputs of ``max |exported - eager| / max |eager|`` on a random input of ``shape``."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _as_list(model(x))
    got = run(x)
    if len(got) != len(expected):
        raise RuntimeError(f"the exported model returns {len(got)} outputs, eager {len(expected)}")
    return max(float((g.detach() - e).abs().max() / e.abs().max().clamp_min(1e-30)) for g, e in zip(got, expected))


def export_one(name, output: Path, fmt: str, checkpoint=None, features=False, img_size=None, batch_size=2,
               opset=DEFAULT_OPSET, verify=False, config=None, optimize=True) -> dict:
    """Export one preset (or ``config``'s backbone and neck); returns ``{'seconds': export time,
    'errors': {shape: rel. error}}``."""
    model = build_dense(config, checkpoint) if config else build_model(name, checkpoint, features)
    x = example_input(model, img_size, batch_size)
    start = time.perf_counter()
    save(export_program(model, x), x, fmt, output, opset, optimize)
    report = {"seconds": time.perf_counter() - start, "errors": {}}
    if verify:
        run = runner(fmt, output)
        report["errors"] = {shape: max_relative_error(model, run, shape) for shape in verify_sizes(x)}
    return report


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--model", nargs="+", help="preset name(s) of this package")
    target.add_argument("--config", help="mmdet/mmseg config: export its backbone and neck")
    parser.add_argument("--checkpoint", help="weights (official, converted or tools/train.py's)")
    parser.add_argument("--features", action="store_true", help="export the features_only backbone")
    parser.add_argument("--format", choices=["onnx", "pt2"], required=True)
    parser.add_argument("--output", required=True,
                        help="output file, or a folder (existing, ending in /, or with several --model)")
    parser.add_argument("--img-size", type=int, nargs=2, metavar=("H", "W"), help="example input size")
    parser.add_argument("--batch-size", type=int, default=2, help="example batch size (>= 2)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (>= {MIN_OPSET})")
    parser.add_argument("--no-optimize", dest="optimize", action="store_false",
                        help="skip the ONNX exporter's graph optimizer (faster export)")
    parser.add_argument("--verify", action="store_true", help=f"check against eager, exit 1 above {TOLERANCE}")
    args = parser.parse_args(argv)
    if args.checkpoint and args.model and len(args.model) > 1:
        parser.error("--checkpoint goes with a single --model")
    if args.config and args.features:
        parser.error("--features goes with --model (a --config export is the backbone and neck)")
    return args


def output_path(output: str, name: str, fmt: str, features: bool = False, several: bool = False) -> Path:
    """The file to write ``name`` (a preset, or a config's path) to: ``output`` itself, or
    ``output/NAME[_features].FORMAT`` when ``output`` is a folder: an existing one, a path ending in
    ``/``, or any path when exporting ``several`` models."""
    path = Path(output)
    if several or path.is_dir() or output.endswith(("/", os.sep)):
        return path / f"{Path(name).stem}{'_features' if features else ''}.{fmt}"
    return path


def main(argv=None) -> int:
    args = parse_args(argv)
    failed = False
    for name in args.model or [args.config]:
        output = output_path(args.output, name, args.format, args.features, bool(args.model) and len(args.model) > 1)
        try:
            report = export_one(name, output, args.format, args.checkpoint, args.features, args.img_size,
                                args.batch_size, args.opset, args.verify, config=args.config,
                                optimize=args.optimize)
        except (ValueError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        errors = ", ".join(f"{'x'.join(map(str, s))}: {e:.2e}" for s, e in report["errors"].items())
        print(f"{name}{' (features)' if args.features else ''} -> {output} ({report['seconds']:.1f} s)"
              + (f"; max rel. error vs eager {errors}" if errors else ""))
        failed |= any(e > TOLERANCE for e in report["errors"].values())
    if failed:
        print(f"FAILED: max relative error above {TOLERANCE}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
