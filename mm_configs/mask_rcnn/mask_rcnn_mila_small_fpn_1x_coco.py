# Mask R-CNN 1x on COCO with MILA-S (MLLA-S); 8 GPUs x 2 images. The release's settings
# (mlla_s_mrcnn_1x.py): those of MILA-T 1x, drop path 0.1.
_base_ = './mask_rcnn_mila_tiny_fpn_1x_coco.py'
model = dict(
    backbone=dict(
        model_name='mila_small',
        drop_path_rate=0.1,
        # MLLA-S: https://cloud.tsinghua.edu.cn/f/0e5d0b1409d540aaa80c/?dl=1
        init_cfg=dict(checkpoint='data/pretrained/mlla_s.pth')),
    neck=dict(in_channels=[64, 128, 256, 512]))
