# Quick start: Mask R-CNN with a micro PPMA (1.5 M backbone parameters, random init) on the
# generated shapes (python tools/make_shapes_dataset.py data/shapes), trained on a CPU in
# minutes; evaluates COCO bbox/segm mAP at the end. Slim heads, 128x128 images.
_base_ = [
    '../_base_/models/mask_rcnn_ppma_fpn.py', '../_base_/datasets/shapes_instance.py',
    '../_base_/det_runtime.py'
]
num_classes = 3
width = 64  # channels of the FPN and the heads
model = dict(
    backbone=dict(
        model_name='ppma_tiny',
        embed_dims=(32, 64, 128, 256),
        depths=(1, 1, 2, 1),
        num_heads=(1, 2, 4, 8),
        drop_path_rate=0.0),
    neck=dict(in_channels=[32, 64, 128, 256], out_channels=width),
    rpn_head=dict(in_channels=width, feat_channels=width),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=width),
        bbox_head=dict(in_channels=width, fc_out_channels=256, num_classes=num_classes),
        mask_roi_extractor=dict(out_channels=width),
        mask_head=dict(num_convs=2, in_channels=width, conv_out_channels=width,
                       num_classes=num_classes)),
    train_cfg=dict(
        rpn=dict(sampler=dict(num=128)),
        rpn_proposal=dict(nms_pre=500, max_per_img=200),
        rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(
        rpn=dict(nms_pre=500, max_per_img=200),
        rcnn=dict(max_per_img=20)))

max_iters = 300
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', T_max=max_iters, eta_min=1e-5, by_epoch=False,
         begin=0, end=max_iters)
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.001, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='NoDecayOptimWrapperConstructor',  # no decay on the model's no_weight_decay()
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}),
    clip_grad=dict(max_norm=10.0))

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False, window_size=20)
