# Mask R-CNN 3x on COCO with MILA-B (MLLA-B); 8 GPUs x 2 images.
# NOT RELEASED: the MLLA release has no MLLA-B 3x config and the paper reports no MLLA-B 3x
# result. This is the released 3x recipe of MILA-T/S (mlla_{t,s}_mrcnn_3x.py) with their
# drop path 0.3 -- an unverified extrapolation.
_base_ = './mask_rcnn_mila_tiny_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        model_name='mila_base',
        drop_path_rate=0.3,
        # MLLA-B: https://cloud.tsinghua.edu.cn/f/91c85c5a1061496d8796/?dl=1
        init_cfg=dict(checkpoint='data/pretrained/mlla_b.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
