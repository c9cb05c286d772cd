# Mask R-CNN 1x (12 epochs) as released for PPMA: AdamW, lr 1e-4, weight decay 0.05, total
# batch 16 (8 GPUs x 2), linear warm-up over 500 iterations, lr x0.1 after epochs 8 and 11.
# No weight decay on parameters named *norm* (the backbone's norm layers, as released) nor on
# the parameters the model declares in no_weight_decay() (PPMA: the polyline decay's dt_bias and
# A_log), which ppma.mm.NoDecayOptimWrapperConstructor asks it for.
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1)
]

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05, fused=True),
    constructor='NoDecayOptimWrapperConstructor',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}))

auto_scale_lr = dict(enable=False, base_batch_size=16)
