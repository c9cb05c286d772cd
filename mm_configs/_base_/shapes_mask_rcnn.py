# The detection quick starts' Mask R-CNN on the generated shapes (python tools/make_shapes_dataset.py
# data/shapes), for a micro backbone of any family, random init, trained on a CPU in minutes;
# evaluates COCO bbox/segm mAP at the end. Slim heads, 128x128 images, 300 iterations, AdamW.
# Each quick start sets its backbone (model.backbone.model_name and sizes) and the FPN's in_channels.
_base_ = [
    './models/mask_rcnn_fpn.py', './datasets/shapes_instance.py', './det_runtime.py'
]
num_classes = 3
width = 64  # channels of the FPN and the heads
model = dict(
    backbone=dict(drop_path_rate=0.0),
    neck=dict(out_channels=width),
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
    optimizer=dict(type='AdamW', lr=0.001, betas=(0.9, 0.999), weight_decay=0.05, fused=True),
    constructor='NoDecayOptimWrapperConstructor',  # no decay on the model's no_weight_decay()
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}),
    clip_grad=dict(max_norm=10.0))

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False, window_size=20)
