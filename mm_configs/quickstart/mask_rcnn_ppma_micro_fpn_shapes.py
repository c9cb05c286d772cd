# Quick start: Mask R-CNN with a micro PPMA (1.5 M backbone parameters, random init) on the
# generated shapes; everything else as _base_/shapes_mask_rcnn.py.
_base_ = '../_base_/shapes_mask_rcnn.py'
model = dict(
    backbone=dict(
        model_name='ppma_tiny',
        embed_dims=(32, 64, 128, 256),
        depths=(1, 1, 2, 1),
        num_heads=(1, 2, 4, 8)),
    neck=dict(in_channels=[32, 64, 128, 256]))
