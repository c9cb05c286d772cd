# vim_small on ImageNet-1k, the released recipe (hustvl/Vim: vim/scripts/pt-vim-*.sh, main.py):
# 8 GPUs x 64 (total 512), AdamW lr 1e-3, weight decay 0.05, drop path 0.05, 300 epochs;
# EMA decay 0.99996 per step; fp32 (the scripts pass --no_amp). Released top-1: 80.5%.
_base_ = [
    '../../_base_/models/preset_classifier.py', '../../_base_/datasets/imagenet_cls.py',
    '../../_base_/schedules/cls_deit_300e.py', '../../_base_/cls_runtime.py'
]
model = dict(model_name='vim_small', num_classes=1000, drop_path_rate=0.05)
train_dataloader = dict(batch_size=64, sampler=dict(type='RepeatAugSampler', shuffle=True, num_repeats=3))
auto_scale_lr = dict(base_batch_size=512)
custom_hooks = [
    dict(type='ClassCountCheckHook'),
    dict(type='EMAHook', momentum=4e-5, update_buffers=True, priority='ABOVE_NORMAL'),
]
