# Mask R-CNN 3x on COCO with VMamba-T [s1l8], preset vmamba_tiny; 8 GPUs x 2 images.
# Settings of the release (github.com/MzeroMiko/VMamba, detection/configs/vssm1/
# mask_rcnn_vssm_fpn_coco_tiny_ms_3x.py, on mmdet's Swin-T Mask R-CNN 1x config): AdamW lr 1e-4,
# weight decay 0.05, no decay on *norm* parameters, drop path 0.2, 36 epochs (lr x0.1 after
# 27 and 33, linear warm-up 1000 iterations),
# the multi-scale + crop training pipeline (datasets/coco_instance_ms.py).
# Not as released: no weight decay on SS2D's A_logs, Ds, dt_projs_bias (the model's
# no_weight_decay(); the release's mmengine constructor decays them).
# The released detection backbone has a LayerNorm on each output (outnorm{i}); features_only
# VMamba models have them too (out_norms.{i}, initialised fresh from a classification checkpoint).
_base_ = [
    '../_base_/models/mask_rcnn_fpn.py', '../_base_/datasets/coco_instance_ms.py',
    '../_base_/schedules/mask_rcnn_3x.py', '../_base_/det_runtime.py'
]
model = dict(
    backbone=dict(
        type='PyramidBackbone',
        model_name='vmamba_tiny',
        drop_path_rate=0.2,
        # Official ImageNet-1k checkpoint VMamba-T [s1l8], downloaded first from
        # https://github.com/MzeroMiko/VMamba/releases/download/%23v2cls/vssm1_tiny_0230s_ckpt_epoch_264.pth
        # (override the path with --cfg-options model.backbone.init_cfg.checkpoint=PATH).
        init_cfg=dict(type='Pretrained', checkpoint='data/pretrained/vssm1_tiny_0230s_ckpt_epoch_264.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[27, 33], gamma=0.1)
]
