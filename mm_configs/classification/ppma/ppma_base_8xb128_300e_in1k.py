# ppma_base on ImageNet-1k, the released recipe (zhongchenzhao/PPMA: classification/main.py, README):
# 8 GPUs x 128 (total 1024), AdamW lr 1e-3, weight decay 0.05, drop path 0.4, 300 epochs;
# EMA decay 0.99996 ** (1024 / 512) per step. Released top-1: 85.0%.
_base_ = [
    '../../_base_/models/preset_classifier.py', '../../_base_/datasets/imagenet_cls.py',
    '../../_base_/schedules/cls_deit_300e.py', '../../_base_/cls_runtime.py'
]
model = dict(model_name='ppma_base', num_classes=1000, drop_path_rate=0.4)
train_dataloader = dict(batch_size=128, sampler=dict(type='RepeatAugSampler', shuffle=True, num_repeats=3))
custom_hooks = [
    dict(type='ClassCountCheckHook'),
    dict(type='EMAHook', momentum=8e-5, update_buffers=True, priority='ABOVE_NORMAL'),
]
