# The segmentation quick starts' UPerNet on the generated shapes (python tools/make_shapes_dataset.py
# data/shapes), for a micro backbone of any family, random init, trained on a CPU in minutes;
# evaluates mIoU at the end. Slim heads, 128x128 crops, 800 iterations, AdamW; SyncBN of the
# released heads (BN on a CPU, see ppma.mm.runtime). Each quick start sets its backbone
# (model.backbone.model_name and sizes) and the heads' in_channels.
_base_ = [
    './models/upernet.py', './datasets/shapes_semantic.py', './seg_runtime.py'
]
num_classes = 4
crop_size = (128, 128)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(drop_path_rate=0.0),
    decode_head=dict(channels=64, num_classes=num_classes),
    auxiliary_head=dict(channels=32, num_classes=num_classes))

max_iters = 800
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=50, end=max_iters, by_epoch=False)
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.002, betas=(0.9, 0.999), weight_decay=0.05, fused=True),
    constructor='NoDecayOptimWrapperConstructor',  # no decay on the model's no_weight_decay()
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}))

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=False),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=1))
log_processor = dict(by_epoch=False, window_size=20)
