# mila_tiny on ImageNet-1k, the released recipe (LeapLabTHU/MLLA: cfgs/mlla_*.yaml, config.py, main.py):
# 8 GPUs x 128 (total 1024), AdamW lr 1e-3, weight decay 0.05, drop path 0.2, 300 epochs;
# EMA decay 0.9996 ** (1024 / 4096) per step. Not reproduced: the release's MESA
# (self-distillation from the EMA after 25% of training; no mmpretrain counterpart). Released top-1: 83.5%.
_base_ = [
    '../../_base_/models/preset_classifier.py', '../../_base_/datasets/imagenet_cls.py',
    '../../_base_/schedules/cls_swin_300e.py', '../../_base_/cls_runtime.py'
]
model = dict(model_name='mila_tiny', num_classes=1000, drop_path_rate=0.2)
train_dataloader = dict(batch_size=128)
custom_hooks = [
    dict(type='ClassCountCheckHook'),
    dict(type='EMAHook', momentum=1e-4, update_buffers=True, priority='ABOVE_NORMAL'),
]
