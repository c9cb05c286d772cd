"""Our preset against the official model, same weights, one process: output error and time ratio.

    python tools/compare_official.py --official DIR --model ppma_tiny [--size 224 224]
        [--batch-size 8] [--threads 2] [--repeats 5] [--backend auto]
    python tools/compare_official.py --official DIR --model mila_tiny --train --count [--batch-size 1]
        [--autocast bf16] [--paths gpu]

``DIR``: a copy of the official repository of the model's family that you fetched (nothing
official is shipped here): github.com/zhongchenzhao/PPMA (``ppma_*``), MzeroMiko/VMamba
(``vmamba_*``), hustvl/Vim (``vim_*``), LeapLabTHU/MLLA (``mila_*``). The official model file is
imported from ``DIR`` by path and built in eval mode; every floating parameter is perturbed by
0.02 N(0, 1) (seeded) so that no zero-initialised weight hides a difference; its ``state_dict``
is converted to our layout by our ``checkpoint_filter_fn`` and loaded strictly into our preset.
Both run inference on one random batch: one warm-up each, then ``--repeats`` rounds alternating
the two; prints the max relative error of our logits (``max |ours - official| / max |official|``)
and the ratio of the median times (ours / official; below 1: ours is faster). ``--backend``:
``PPMA_BACKEND`` for our model (``auto``: the CPU kernels; ``torch``: the plain reference).

The official code runs on the CPU through its own PyTorch paths: VMamba's ``selective_scan_torch``
and ``CrossScanF`` / ``CrossMergeF`` (called without the ``torch.cuda.device`` context that
``cross_scan_fn`` opens, which fails on CPU tensors); Vim's fast path (both directions) with its
CUDA calls replaced by the release's reference math: ``selective_scan_ref``, the fused add +
RMSNorm as ``rms_norm_ref`` (fp32), and the causal depthwise conv as a padded ``conv1d`` + SiLU.
MLLA and PPMA are plain PyTorch. Families: see :data:`OFFICIAL`.

``--train --count``: instead, one training step of each model (AdamW, both in train mode, same
input) counted by :func:`ppma.bench.step_count.count_training_step`: aten ops dispatched
(forward, backward, optimizer), copies and the bytes they write, parameter tensors the optimizer
updates. ``--autocast bf16`` runs the forward under bf16 autocast; ``--paths`` picks the layer
arrangement of :mod:`ppma.layers.paths` for our model (default: the one training uses, ``gpu``).
"""
from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from .gpu import correctness
from .gpu.official import import_file
from .profile_models import interleaved_medians
from .step_count import add_step_arguments, count_training_step, step_autocast

VIM_T = "vim_tiny_patch16_224_bimambav2_final_pool_mean_abs_pos_embed_with_midclstok_div2"
VIM_S = "vim_small_patch16_224_bimambav2_final_pool_mean_abs_pos_embed_with_midclstok_div2"
MLLA = "MLLA"

# our preset -> (file of the official repository, its constructor, its keyword arguments)
OFFICIAL = {
    "ppma_tiny": ("classification/models/PPMA.py", "PPMAViT_T", None),
    "ppma_small": ("classification/models/PPMA.py", "PPMAViT_S", None),
    "ppma_base": ("classification/models/PPMA.py", "PPMAViT_B", None),
    "vmamba_tiny": ("classification/models/vmamba.py", "vmamba_tiny_s1l8", {}),
    "vmamba_small": ("classification/models/vmamba.py", "vmamba_small_s1l20", {}),
    "vmamba_base": ("classification/models/vmamba.py", "vmamba_base_s1l20", {}),
    "vmamba_tiny_v0": ("classification/models/vmamba.py", "vanilla_vmamba_tiny", {}),
    "vim_tiny": ("vim/models_mamba.py", VIM_T, {}),
    "vim_small": ("vim/models_mamba.py", VIM_S, {}),
    "mila_tiny": ("models/mlla.py", MLLA, dict(embed_dim=64, depths=[2, 4, 8, 4], num_heads=[2, 4, 8, 16])),
    "mila_small": ("models/mlla.py", MLLA, dict(embed_dim=64, depths=[3, 6, 21, 6], num_heads=[2, 4, 8, 16])),
    "mila_base": ("models/mlla.py", MLLA, dict(embed_dim=96, depths=[3, 6, 21, 6], num_heads=[3, 6, 12, 24])),
}


def _stub_module(name: str, **attributes) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules.setdefault(name, module)


def _causal_conv1d(x, weight, bias=None, activation=None):
    """Causal depthwise conv ``(B, D, L)``, weight ``(D, W)``, as ``causal_conv1d_fn`` computes it."""
    width = weight.shape[-1]
    y = F.conv1d(F.pad(x, (width - 1, 0)), weight[:, None], bias, groups=x.shape[1])
    return F.silu(y) if activation in ("silu", "swish") else y


def _prepare_vim(directory: Path) -> None:
    """Let ``vim/models_mamba.py`` import without the CUDA extensions (stubs for what is not run)."""
    sys.path[:0] = [str(directory / "mamba-1p1p1"), str(directory / "vim")]
    _stub_module("selective_scan_cuda")
    _stub_module("causal_conv1d_cuda")
    _stub_module("causal_conv1d", causal_conv1d_fn=_causal_conv1d, causal_conv1d_update=None)
    outputs = dict(GreedySearchDecoderOnlyOutput=object, SampleDecoderOnlyOutput=object, TextStreamer=object)
    _stub_module("transformers")
    _stub_module("transformers.generation", **outputs)
    _stub_module("transformers.utils", WEIGHTS_NAME="", CONFIG_NAME="")
    _stub_module("transformers.utils.hub", cached_file=None)


def _patch_vim(module) -> None:
    """Vim's fast path with the release's reference math in place of its CUDA / Triton kernels."""
    interface = sys.modules["mamba_ssm.ops.selective_scan_interface"]
    simple = sys.modules["mamba_ssm.modules.mamba_simple"]
    norms = sys.modules["mamba_ssm.ops.triton.layer_norm"]

    def inner_no_out_proj(xz, conv_weight, conv_bias, x_proj_weight, dt_proj_weight, A, B=None, C=None, D=None,
                          delta_bias=None, B_proj_bias=None, C_proj_bias=None, delta_softplus=True):
        """``mamba_inner_ref`` without its output projection: ``(B, 2 D, L)`` -> ``(B, D, L)``."""
        x, z = xz.chunk(2, dim=1)
        x = _causal_conv1d(x, conv_weight[:, 0], conv_bias, "silu")
        rank, n_state = dt_proj_weight.shape[1], A.shape[-1]
        x_dbl = F.linear(x.transpose(1, 2), x_proj_weight)  # (B, L, R + 2 N)
        delta = (x_dbl[..., :rank] @ dt_proj_weight.t()).transpose(1, 2)
        B, C = x_dbl[..., rank:rank + n_state].transpose(1, 2), x_dbl[..., -n_state:].transpose(1, 2)
        return interface.selective_scan_ref(x, delta, A, B.contiguous(), C.contiguous(), D, z=z,
                                            delta_bias=delta_bias, delta_softplus=delta_softplus)

    def rms_norm(x, weight, bias, residual=None, eps=1e-6, prenorm=False, residual_in_fp32=False, **_):
        return norms.rms_norm_ref(x, weight, bias, residual=residual, eps=eps, prenorm=prenorm, upcast=True)

    simple.mamba_inner_fn_no_out_proj = inner_no_out_proj
    for target in (module, simple, norms):
        target.rms_norm_fn = rms_norm


def _patch_vmamba(module) -> None:
    """The release's own ``CrossScanF`` / ``CrossMergeF``, without the CUDA-only device context."""
    release = sys.modules["csm_triton"]

    def cross_scan(x, in_channel_first=True, out_channel_first=True, one_by_one=False, scans=0, force_torch=False):
        return release.CrossScanF.apply(x, in_channel_first, out_channel_first, one_by_one, scans)

    def cross_merge(y, in_channel_first=True, out_channel_first=True, one_by_one=False, scans=0, force_torch=False):
        return release.CrossMergeF.apply(y, in_channel_first, out_channel_first, one_by_one, scans)

    module.cross_scan_fn, module.cross_merge_fn = cross_scan, cross_merge


PREPARE = {"vim/models_mamba.py": _prepare_vim}
PATCH = {"vim/models_mamba.py": _patch_vim, "classification/models/vmamba.py": _patch_vmamba}


def load_official(directory: str, model: str) -> torch.nn.Module:
    """Build the official counterpart of ``model`` from the repository copy in ``directory``."""
    relative, constructor, kwargs = OFFICIAL[model]
    path = Path(directory) / relative
    if not path.is_file():
        raise FileNotFoundError(f"--official {directory}: no {relative} there (fetch the official repository "
                                f"of {model}'s family)")
    if relative in PREPARE:
        PREPARE[relative](Path(directory))
    module = import_file(path)  # in sys.modules: timm's register_model looks the module up
    if relative in PATCH:
        PATCH[relative](module)
    build = getattr(module, constructor)
    official = build(**kwargs) if kwargs is not None else build(None)
    with torch.no_grad():
        for p in official.parameters():
            if p.is_floating_point():
                p.add_(0.02 * torch.randn_like(p))
    return official.eval()


def load_ours(model: str, official: torch.nn.Module) -> torch.nn.Module:
    """Our preset with the official model's weights, converted and loaded strictly."""
    import timm

    import ppma  # noqa: F401  (registers the presets)
    from ppma.models.checkpoint import load_strict

    ours = timm.create_model(model).eval()
    filter_fn = sys.modules[type(ours).__module__].checkpoint_filter_fn
    load_strict(ours, official.state_dict(), filter_fn, source=f"the official {model} weights")
    return ours


def compare(ours, official, x, backend, repeats) -> tuple[float, float, float, float]:
    """``(max relative error, our median s, official median s, ratio)``, interleaved runs
    (:func:`~ppma.bench.profile_models.interleaved_medians`; ours with ``PPMA_BACKEND=backend``)."""
    with torch.inference_mode():
        want = official(x)
        with correctness.backend(backend):
            got = ours(x)
    error = ((got - want).abs().max() / want.abs().max()).item()
    medians = interleaved_medians({"official": (official, x, None), "ours": (ours, x, backend)}, repeats)
    return error, medians["ours"], medians["official"], medians["ours"] / medians["official"]


def print_step_counts(ours, official, x, args) -> None:
    """One counted training step of each model (``--train --count``), ours with ``--paths``."""
    autocast = step_autocast(args)
    counts = {"official": count_training_step(official, x, autocast),
              f"ours ({args.paths} paths)": count_training_step(ours, x, autocast, paths=args.paths)}
    shape = "x".join(map(str, x.shape))
    for who, count in counts.items():
        print(f"{args.model} {shape} train step, {who}: {count.row()}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--official", required=True, metavar="DIR", help="the fetched official repository")
    parser.add_argument("--model", required=True, choices=sorted(OFFICIAL))
    parser.add_argument("--size", type=int, nargs=2, default=(224, 224), metavar=("H", "W"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default="auto", choices=["auto", "torch"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", action="store_true", help="a training step instead of inference (with --count)")
    parser.add_argument("--count", action="store_true", help="count ops and copies instead of timing (with --train)")
    add_step_arguments(parser)
    args = parser.parse_args(argv)
    if args.train != args.count:
        parser.error("--train and --count go together (a counted training step)")
    if args.repeats < 1 or args.batch_size < 1 or args.threads < 1:
        parser.error("--repeats, --batch-size and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    official = load_official(args.official, args.model)
    ours = load_ours(args.model, official)
    x = torch.randn(args.batch_size, 3, *args.size)
    if args.count:
        print_step_counts(ours, official, x, args)
        return
    error, mine, theirs, ratio = compare(ours, official, x, args.backend, args.repeats)
    print(f"{args.model} {args.batch_size}x3x{args.size[0]}x{args.size[1]} backend={args.backend} "
          f"threads={args.threads}: max rel err {error:.2e}; ours {mine:.3f} s, official {theirs:.3f} s "
          f"(medians of {args.repeats}): {ratio:.2f}x")


if __name__ == "__main__":
    main()
