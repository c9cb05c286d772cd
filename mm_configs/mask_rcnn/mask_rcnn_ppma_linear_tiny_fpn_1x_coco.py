# Mask R-CNN 1x on COCO with PPMA-linear-T (linear polyline attention in every stage); 8 GPUs x 2 images.
_base_ = './mask_rcnn_ppma_tiny_fpn_1x_coco.py'
# No ImageNet checkpoint is released for the linear kind: pass one trained with timm
# (--cfg-options model.backbone.init_cfg.checkpoint=PATH) or train from scratch.
model = dict(
    backbone=dict(
        model_name='ppma_linear_tiny',
        init_cfg=None))
