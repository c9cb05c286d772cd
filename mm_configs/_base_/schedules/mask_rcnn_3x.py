# Mask R-CNN 3x (36 epochs): the 1x recipe with lr x0.1 after epochs 27 and 33 (use it with
# the multi-scale training pipeline of datasets/coco_instance_ms.py).
_base_ = ['./mask_rcnn_1x.py']

train_cfg = dict(max_epochs=36)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[27, 33], gamma=0.1)
]
