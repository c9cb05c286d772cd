# A whole timm preset of this package (its released head included) as an mmpretrain classifier;
# configs set model_name, drop_path_rate and num_classes. The ImageNet-1k recipes of every family
# (DeiT's): label smoothing 0.1 on Mixup (alpha 0.8) / CutMix (alpha 1.0) targets, one of the two
# per batch.
model = dict(
    type='PresetClassifier',
    loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))
