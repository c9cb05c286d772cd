# Mask R-CNN 3x on COCO with VMamba-S [s2l15], preset vmamba_small_s2l15; 8 GPUs x 2 images.
# The release's settings (github.com/MzeroMiko/VMamba, detection/configs/vssm1/
# mask_rcnn_vssm_fpn_coco_small_ms_3x.py): VMamba-T's 3x recipe with drop path 0.3.
_base_ = './mask_rcnn_vmamba_tiny_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        model_name='vmamba_small_s2l15',
        drop_path_rate=0.3,
        # Official ImageNet-1k checkpoint VMamba-S [s2l15], downloaded first from
        # https://github.com/MzeroMiko/VMamba/releases/download/%23v2cls/vssm_small_0229_ckpt_epoch_222.pth
        init_cfg=dict(checkpoint='data/pretrained/vssm_small_0229_ckpt_epoch_222.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
