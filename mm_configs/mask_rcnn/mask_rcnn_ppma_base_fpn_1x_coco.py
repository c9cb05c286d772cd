# Mask R-CNN 1x on COCO with PPMA-B; 8 GPUs x 2 images.
_base_ = './mask_rcnn_ppma_tiny_fpn_1x_coco.py'
model = dict(
    backbone=dict(
        model_name='ppma_base',
        drop_path_rate=0.4,
        init_cfg=dict(checkpoint='https://huggingface.co/ZhongchenZhao/PPMA/resolve/main/checkpoints/classification/PPMA_B_202504101400/best.pth')),
    neck=dict(in_channels=[80, 160, 320, 512]))
