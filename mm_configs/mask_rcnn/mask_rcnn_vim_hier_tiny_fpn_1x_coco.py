# Mask R-CNN 1x on COCO with the hierarchical Vim at PPMA-T's widths and depths; 8 GPUs x 2 images.
# NOT RELEASED: vim_hier_tiny is this package's model (Vim blocks over each stage's raster
# sequence), with no released checkpoint: train it on ImageNet-1k first and point init_cfg at
# that checkpoint. The recipe is PPMA-T's (mask_rcnn_ppma_tiny_fpn_1x_coco.py: AdamW lr 1e-4,
# weight decay 0.05, no decay on *norm* parameters nor on the model's no_weight_decay() (A_log,
# D), drop path 0.1, 12 epochs), so that the families compare under one recipe.
_base_ = [
    '../_base_/models/mask_rcnn_fpn.py', '../_base_/datasets/coco_instance.py',
    '../_base_/schedules/mask_rcnn_1x.py', '../_base_/det_runtime.py'
]
model = dict(
    backbone=dict(
        type='PyramidBackbone',
        model_name='vim_hier_tiny',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='data/pretrained/vim_hier_tiny_in1k.pth')),
    neck=dict(in_channels=[64, 128, 256, 512]))
