# vmamba_tiny on ImageNet-1k, the released recipe (MzeroMiko/VMamba:
# classification/configs/vssm/vmambav2v_*_224.yaml, config.py, main.py):
# 8 GPUs x 128 (total 1024), AdamW lr 1e-3, weight decay 0.05, drop path 0.2, 300 epochs;
# EMA decay 0.9999 per step. Released top-1: 82.6%.
_base_ = [
    '../../_base_/models/preset_classifier.py', '../../_base_/datasets/imagenet_cls.py',
    '../../_base_/schedules/cls_swin_300e.py', '../../_base_/cls_runtime.py'
]
model = dict(model_name='vmamba_tiny', num_classes=1000, drop_path_rate=0.2)
train_dataloader = dict(batch_size=128)
custom_hooks = [
    dict(type='ClassCountCheckHook'),
    dict(type='EMAHook', momentum=1e-4, update_buffers=True, priority='ABOVE_NORMAL'),
]
