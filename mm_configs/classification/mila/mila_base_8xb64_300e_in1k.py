# mila_base on ImageNet-1k, the released recipe (LeapLabTHU/MLLA: cfgs/mlla_*.yaml, config.py, main.py):
# 8 GPUs x 64 (total 512), AdamW lr 5e-4, weight decay 0.05, drop path 0.5, 300 epochs;
# EMA decay 0.9996 ** (512 / 4096) per step. Not reproduced: the release's MESA
# (self-distillation from the EMA after 25% of training; no mmpretrain counterpart). Released top-1: 85.3%.
_base_ = [
    '../../_base_/models/preset_classifier.py', '../../_base_/datasets/imagenet_cls.py',
    '../../_base_/schedules/cls_swin_300e.py', '../../_base_/cls_runtime.py'
]
model = dict(model_name='mila_base', num_classes=1000, drop_path_rate=0.5)
optim_wrapper = dict(optimizer=dict(lr=0.0005))
param_scheduler = [  # warm-up from and cosine to the release's lr / 1000 and lr / 100
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=20, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=5e-06, by_epoch=True, begin=20, end=300,
         convert_to_iter_based=True),
]
train_dataloader = dict(batch_size=64)
auto_scale_lr = dict(base_batch_size=512)
custom_hooks = [
    dict(type='ClassCountCheckHook'),
    dict(type='EMAHook', momentum=5e-5, update_buffers=True, priority='ABOVE_NORMAL'),
]
