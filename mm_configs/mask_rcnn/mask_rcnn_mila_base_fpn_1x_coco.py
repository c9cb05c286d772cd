# Mask R-CNN 1x on COCO with MILA-B (MLLA-B); 8 GPUs x 2 images. The release's settings
# (mlla_b_mrcnn_1x.py): those of MILA-T 1x, drop path 0.1.
_base_ = './mask_rcnn_mila_tiny_fpn_1x_coco.py'
model = dict(
    backbone=dict(
        model_name='mila_base',
        drop_path_rate=0.1,
        # MLLA-B: https://cloud.tsinghua.edu.cn/f/91c85c5a1061496d8796/?dl=1
        init_cfg=dict(checkpoint='data/pretrained/mlla_b.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
