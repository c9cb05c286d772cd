"""Command-line pieces shared by ``demo/image_demo.py`` and ``tools/visualize_*.py``."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable

import numpy as np
import torch

from .capture import AttentionRecord, capture_attention, last_per_stage
from .loading import load_model, preprocess

logger = logging.getLogger("ppma.vis")


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--checkpoint``, ``--size``, ``--layer``, ``--seed``, ``--device``."""
    parser.add_argument("--model", default="ppma_tiny", help="timm preset name (default: ppma_tiny)")
    parser.add_argument(
        "--checkpoint",
        help="official PPMA .pth, converted .safetensors, or an OpenMMLab detector/segmentor .pth "
        "(its backbone); without it the weights are random",
    )
    parser.add_argument("--size", type=int, nargs="+", metavar="PX", help="input size H [W] (default: the preset's)")
    parser.add_argument(
        "--layer",
        nargs="+",
        help="attention layers by index (0 = first, -1 = last) or module name "
        "(default: the last layer of every stage)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the random weights without --checkpoint (default: 0)"
    )
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")


def add_figure_args(parser: argparse.ArgumentParser, gif: bool) -> None:
    """``--dpi`` and, with ``gif``, ``--gif-grid`` (the raster of query points the GIF visits)."""
    parser.add_argument(
        "--dpi", type=int, default=100, help="figure resolution; GIF frames use 60%% of it (default: 100)"
    )
    if gif:
        parser.add_argument(
            "--gif-grid", type=int, nargs=2, default=(4, 4), metavar=("ROWS", "COLS"),
            help="the GIF's query points: a ROWS x COLS raster over the image (default: 4 4)",
        )


def gif_dpi(args: argparse.Namespace) -> int:
    return max(1, round(0.6 * args.dpi))


def load_model_from_args(args: argparse.Namespace) -> tuple[torch.nn.Module, bool]:
    """Build the model named by ``args`` and load its checkpoint; returns ``(model, has_classifier)``."""
    torch.manual_seed(args.seed)
    model, has_classifier = load_model(args.model, args.checkpoint)
    if not args.checkpoint:
        logger.warning("no --checkpoint given: the weights are RANDOM, the maps show an untrained %s", args.model)
    return model.to(args.device), has_classifier


def input_size(args: argparse.Namespace, model: torch.nn.Module) -> tuple[int, int]:
    if args.size is None:
        return tuple(model.pretrained_cfg["input_size"][-2:])
    if len(args.size) not in (1, 2) or min(args.size) < 1:
        raise ValueError(f"--size takes one or two positive integers (H [W]), got {args.size}")
    return (args.size[0], args.size[-1])


def run_capture(
    model: torch.nn.Module, image: np.ndarray, args: argparse.Namespace
) -> tuple[list[AttentionRecord], torch.Tensor]:
    """Run ``model.forward_features`` on ``image`` (``(h, w, 3)``, or a ``(T, h, w, 3)`` clip).

    Returns the records of ``args.layer`` (default: :func:`last_per_stage`) and the features.
    """
    cfg = model.pretrained_cfg
    x = preprocess(image, input_size(args, model), cfg["mean"], cfg["std"]).to(args.device)
    with torch.no_grad(), capture_attention(model, args.layer) as records:
        output = model.forward_features(x)
    chosen = last_per_stage(records) if args.layer is None else list(records.values())
    return chosen, output


def run_cli(main: Callable[[], None]) -> None:
    """Run ``main`` and exit 0, or print the error of bad input and exit 2."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    try:
        main()
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
