"""FLOPs and parameters of a config's backbone and of the whole detector/segmentor.

    python tools/get_flops.py CONFIG [--shape 800 1280]

Counted by :mod:`ppma.models.flops` (fvcore, one fused multiply-add = one FLOP as in the
papers, every registered op by its formula) on one image of ``--shape`` (H W), in total and
without the attention products ``q k^T`` and ``weights x v`` (which the paper's detection
FLOPs leave out). Detectors count the test-time network from the image to the head outputs
(RPN, RoI heads on the RPN's proposals); segmentors one whole-image forward (no sliding window).
Ops fvcore has no rule for (e.g. NMS, RoIAlign) are left out.
"""
import argparse
import logging

import torch

from ppma.mm.analysis import TensorForward, build_model, dummy_batch
from ppma.mm.runtime import load_config
from ppma.models.flops import flop_analysis, total_flops


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--shape", type=int, nargs=2, default=(800, 1280), metavar=("H", "W"))
    args = parser.parse_args(argv)
    logging.getLogger("fvcore").setLevel(logging.ERROR)
    cfg = load_config(args.config)
    model = build_model(cfg)
    _, samples = dummy_batch(cfg.default_scope, 1, *args.shape)
    image = torch.zeros(1, 3, *args.shape)
    print(f"{args.config} at {args.shape[0]}x{args.shape[1]}:")
    name = getattr(model.backbone, "model_name", type(model.backbone).__name__)
    parts = ((f"backbone ({name})", model.backbone), (type(model).__name__, TensorForward(model, samples)))
    for label, module in parts:
        analysis = flop_analysis(module, image)
        params = sum(p.numel() for p in module.parameters()) / 1e6
        print(f"  {label}: {total_flops(analysis) / 1e9:.2f} GFLOPs "
              f"({total_flops(analysis, ('products',)) / 1e9:.2f} without attention products), {params:.2f} M params")


if __name__ == "__main__":
    main()
