# Mask R-CNN 3x on COCO with PPMA-S; 8 GPUs x 2 images.
_base_ = './mask_rcnn_ppma_tiny_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        model_name='ppma_small',
        drop_path_rate=0.15,
        init_cfg=dict(checkpoint='https://huggingface.co/ZhongchenZhao/PPMA/resolve/main/checkpoints/classification/PPMA_S_202504021000/best.pth')))
