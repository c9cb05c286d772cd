# Mask R-CNN 3x on COCO with PPMA-linear-T (linear polyline attention in every stage); 8 GPUs x 2 images.
_base_ = [
    '../_base_/models/mask_rcnn_ppma_fpn.py', '../_base_/datasets/coco_instance_ms.py',
    '../_base_/schedules/mask_rcnn_3x.py', '../_base_/det_runtime.py'
]
model = dict(
    backbone=dict(
        model_name='ppma_linear_tiny',
        drop_path_rate=0.1,
        # No ImageNet checkpoint is released for the linear kind: pass one trained with timm
        # (init_cfg=dict(type='Pretrained', checkpoint=...)) or train from scratch.
        init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]))
