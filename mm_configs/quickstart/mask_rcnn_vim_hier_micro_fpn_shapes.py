# Quick start: Mask R-CNN with a micro hierarchical Vim (random init: Vim blocks at widths
# 32-256, depths 1-1-2-1) on the generated shapes (python tools/make_shapes_dataset.py
# data/shapes), trained on a CPU in minutes; evaluates COCO bbox/segm mAP at the end.
# Everything else (slim heads, 128x128 images, 300 iterations, AdamW) as
# _base_/shapes_mask_rcnn.py.
_base_ = '../_base_/shapes_mask_rcnn.py'
model = dict(
    backbone=dict(
        model_name='vim_hier_tiny',
        embed_dims=(32, 64, 128, 256),
        depths=(1, 1, 2, 1)),
    neck=dict(in_channels=[32, 64, 128, 256]))
