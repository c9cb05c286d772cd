# Mask R-CNN 3x on COCO with PPMA-T; 8 GPUs x 2 images.
_base_ = [
    '../_base_/models/mask_rcnn_fpn.py', '../_base_/datasets/coco_instance_ms.py',
    '../_base_/schedules/mask_rcnn_3x.py', '../_base_/det_runtime.py'
]
model = dict(
    backbone=dict(
        model_name='ppma_tiny',
        drop_path_rate=0.1,
        # Official ImageNet-1k checkpoint (or a local/converted copy: override with
        # --cfg-options model.backbone.init_cfg.checkpoint=PATH).
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://huggingface.co/ZhongchenZhao/PPMA/resolve/main/checkpoints/classification/PPMA_T_202502251000/best.pth')),
    neck=dict(in_channels=[64, 128, 256, 512]))
