# Quick start: the tiny test_ppma preset (0.26 M parameters, random init) learns the generated
# shapes (python tools/make_shapes_dataset.py data/shapes: 3 classes, 64x64 images) on a CPU in
# minutes; top-1 on the validation folder, printed after every epoch, rises from chance (33%)
# to about 55% (docs/classification.md).
# Label smoothing, EMA weights and the checkpoints as in the ImageNet recipes; no Mixup/CutMix.
_base_ = [
    '../../_base_/models/preset_classifier.py', '../../_base_/datasets/shapes_cls.py',
    '../../_base_/cls_runtime.py'
]
model = dict(model_name='test_ppma', num_classes=3, drop_path_rate=0.0, train_cfg=None)

max_epochs = 20
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='NoDecayOptimWrapperConstructor',  # no decay on the model's no_weight_decay()
    optimizer=dict(type='AdamW', lr=2e-3, weight_decay=0.05, fused=True),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=max_epochs,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
val_cfg = dict()
test_cfg = dict()

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=1, save_best='auto'))
custom_hooks = [
    dict(type='ClassCountCheckHook'),
    dict(type='EMAHook', momentum=0.05, update_buffers=True, priority='ABOVE_NORMAL'),  # short run: short memory
]
