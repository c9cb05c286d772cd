"""Train a detector (mmdet), segmentor (mmseg) or classifier (mmpretrain) from a config with
mmengine's Runner.

    python tools/train.py mm_configs/quickstart/upernet_ppma_micro_shapes.py
    python tools/train.py mm_configs/classification/quickstart/test_ppma_shapes.py
    python tools/train.py CONFIG --work-dir work_dirs/run1 --cfg-options train_cfg.max_iters=200
    python tools/train.py CONFIG --work-dir work_dirs/run1 --resume       # latest checkpoint there
    python tools/train.py CONFIG --resume work_dirs/run1/iter_100.pth     # that checkpoint
    python tools/train.py CONFIG --compile                                # torch.compile, Inductor
    python tools/train.py CONFIG --compile aot_eager                      # another compiler backend
    bash tools/dist_train.sh CONFIG 8                                     # 8 processes (torchrun)

``--compile [BACKEND]`` compiles the backbone's forward with ``torch.compile`` (in place: parameter
names and checkpoints unchanged; ppma's ops stay single custom ops in the graph). Not mmengine's
``cfg.compile``: it compiles the whole ``train_step``, optimizer and schedulers included, which
Dynamo (torch 2.14) fails on with mmengine 0.10.7's schedulers.

On a machine without CUDA, SyncBN becomes BN and distributed runs use gloo (ppma.mm.runtime).
"""
import argparse

import torch
from mmengine.config import DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ppma.mm.runtime import load_config, prepare_for_device, prepare_for_resume


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file")
    parser.add_argument("--work-dir", help="folder for logs and checkpoints "
                        "(default: ./work_dirs/<config name>)")
    parser.add_argument("--resume", nargs="?", const="auto", metavar="CHECKPOINT",
                        help="resume from CHECKPOINT, or, without a value, from the latest "
                             "checkpoint in the work dir")
    parser.add_argument("--amp", action="store_true", help="mixed precision (needs CUDA)")
    parser.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                        help="torch.compile the backbone's forward, with BACKEND "
                             "(default inductor)")
    parser.add_argument("--auto-scale-lr", action="store_true",
                        help="scale the lr by the actual total batch over auto_scale_lr's base")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, metavar="KEY=VALUE",
                        help="override config entries, e.g. train_cfg.max_iters=100")
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"], default="none")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0,
                        help=argparse.SUPPRESS)  # torch.distributed.launch passes it
    return parser, parser.parse_args(argv)


def main(argv=None):
    parser, args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options, args.work_dir, args.launcher)
    if args.amp:
        if not torch.cuda.is_available():
            parser.error("--amp needs a CUDA device (mmengine's AmpOptimWrapper)")
        if cfg.optim_wrapper.get("type", "OptimWrapper") == "OptimWrapper":
            cfg.optim_wrapper.type = "AmpOptimWrapper"
            cfg.optim_wrapper.setdefault("loss_scale", "dynamic")
    if args.auto_scale_lr:
        if "enable" not in cfg.get("auto_scale_lr", {}):
            parser.error("--auto-scale-lr needs auto_scale_lr=dict(base_batch_size=...) in the config")
        cfg.auto_scale_lr.enable = True
    if args.resume == "auto":
        cfg.resume, cfg.load_from = True, None
    elif args.resume:
        cfg.resume, cfg.load_from = True, args.resume
    prepare_for_device(cfg, args.launcher)
    prepare_for_resume(cfg)  # resume loses nothing: random streams, loader workers' included
    runner = RUNNERS.build(cfg) if "runner_type" in cfg else Runner.from_cfg(cfg)
    if args.compile:
        compile_backbone(runner.model, args.compile)
        runner.logger.info(f"backbone forward compiled with torch.compile (backend {args.compile})")
    runner.train()


def compile_backbone(model: torch.nn.Module, backend: str) -> None:
    """``torch.compile`` the ``backbone``'s forward of ``model`` (a detector, segmentor or classifier,
    or its distributed wrapper) in place, with compiler ``backend``."""
    backbone = getattr(model, "module", model).backbone
    backbone.forward = torch.compile(backbone.forward, backend=backend)


if __name__ == "__main__":
    main()
