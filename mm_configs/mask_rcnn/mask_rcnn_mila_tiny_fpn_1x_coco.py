# Mask R-CNN 1x on COCO with MILA-T (MLLA-T); 8 GPUs x 2 images.
# Settings of the release (github.com/LeapLabTHU/MLLA, downstream/detection/configs/mlla/
# mlla_t_mrcnn_1x.py): AdamW lr 1e-4, weight decay 0.05, no decay on *norm* parameters, drop
# path 0.1, 12 epochs (lr x0.1 after 8 and 11, linear warm-up 500 iterations), and, also for the
# 1x schedule, the multi-scale + crop training pipeline (datasets/coco_instance_ms.py).
# The released detection backbone has a LayerNorm on each output (norm{i}); features_only MILA
# models have them too (out_norms.{i}, initialised fresh from a classification checkpoint).
_base_ = [
    '../_base_/models/mask_rcnn_fpn.py', '../_base_/datasets/coco_instance_ms.py',
    '../_base_/schedules/mask_rcnn_1x.py', '../_base_/det_runtime.py'
]
model = dict(
    backbone=dict(
        type='PyramidBackbone',
        model_name='mila_tiny',
        drop_path_rate=0.1,
        # Official ImageNet-1k checkpoint MLLA-T, downloaded first from
        # https://cloud.tsinghua.edu.cn/f/7a19712877cb4242889c/?dl=1 (override the path with
        # --cfg-options model.backbone.init_cfg.checkpoint=PATH).
        init_cfg=dict(type='Pretrained', checkpoint='data/pretrained/mlla_t.pth')),
    neck=dict(in_channels=[64, 128, 256, 512]))
