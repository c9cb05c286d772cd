# UPerNet 160k on ADE20K 512x512 with PPMA-linear-T (linear polyline attention in every stage);
_base_ = './upernet_ppma_tiny_512x512_160k_ade20k.py'
# No ImageNet checkpoint is released for the linear kind: pass one trained with timm
# (--cfg-options model.backbone.init_cfg.checkpoint=PATH) or train from scratch.
model = dict(
    backbone=dict(
        model_name='ppma_linear_tiny',
        init_cfg=None))
