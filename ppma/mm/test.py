"""Evaluate a checkpoint of a detector (mmdet), segmentor (mmseg) or classifier (mmpretrain) on the
config's test set.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--cfg-options KEY=VALUE ...]
    bash tools/dist_test.sh CONFIG CHECKPOINT 8

Prints the metrics (e.g. coco/bbox_mAP, coco/segm_mAP, mIoU, accuracy/top1) as one JSON line at the end.
"""
import argparse
import json
import numbers

from mmengine.config import DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ppma.mm.runtime import load_config, prepare_for_device


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file")
    parser.add_argument("checkpoint", help="checkpoint written by tools/train.py (path or URL)")
    parser.add_argument("--work-dir", help="folder for the logs (default: ./work_dirs/<config name>)")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, metavar="KEY=VALUE",
                        help="override config entries")
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm", "mpi"], default="none")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options, args.work_dir, args.launcher)
    cfg.load_from = args.checkpoint
    cfg.resume = False
    prepare_for_device(cfg, args.launcher)
    runner = RUNNERS.build(cfg) if "runner_type" in cfg else Runner.from_cfg(cfg)
    metrics = runner.test()
    if runner.rank == 0:
        print(json.dumps({k: float(v) if isinstance(v, numbers.Real) else str(v)
                          for k, v in metrics.items()}))


if __name__ == "__main__":
    main()
