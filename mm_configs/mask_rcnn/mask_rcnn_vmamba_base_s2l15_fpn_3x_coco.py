# Mask R-CNN 3x on COCO with VMamba-B [s2l15], preset vmamba_base_s2l15; 8 GPUs x 2 images.
# NOT RELEASED: the release (github.com/MzeroMiko/VMamba, detection/configs/vssm1/) has 3x configs
# for VMamba-T and VMamba-S only (mask_rcnn_vssm_fpn_coco_{tiny,small}_ms_3x.py). This is their
# recipe with VMamba-B's 1x drop path 0.6 -- an unverified choice.
_base_ = './mask_rcnn_vmamba_tiny_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        model_name='vmamba_base_s2l15',
        drop_path_rate=0.6,
        # Official ImageNet-1k checkpoint VMamba-B [s2l15], downloaded first from
        # https://github.com/MzeroMiko/VMamba/releases/download/%23v2cls/vssm_base_0229_ckpt_epoch_237.pth
        init_cfg=dict(checkpoint='data/pretrained/vssm_base_0229_ckpt_epoch_237.pth')),
    neck=dict(in_channels=[128, 256, 512, 1024]))
