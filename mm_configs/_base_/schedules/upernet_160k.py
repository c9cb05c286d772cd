# UPerNet 160k iterations as released for PPMA: AdamW, lr 6e-5, weight decay 0.05, total batch
# 16 (8 GPUs x 2), linear warm-up from 1e-6 over 1500 iterations, then poly decay (power 1) to 0.
# No weight decay on parameters named *norm* (the backbone's norm layers, as released) nor on
# the parameters the model declares in no_weight_decay() (PPMA: the polyline decay's dt_bias and
# A_log), which ppma.mm.NoDecayOptimWrapperConstructor asks it for.
train_cfg = dict(type='IterBasedTrainLoop', max_iters=160000, val_interval=16000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False)
]

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.05, fused=True),
    constructor='NoDecayOptimWrapperConstructor',
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}))
