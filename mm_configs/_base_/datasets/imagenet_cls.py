# ImageNet-1k as ImageFolders, data/imagenet/{train,val}/<wnid>/*.JPEG (meta/{train,val}.txt
# are used when present), with the augmentation of the DeiT recipe that every family trained
# with: random resized crop 224 (bicubic), flip, RandAugment rand-m9-mstd0.5-inc1, random erasing
# 0.25 (per-pixel noise); evaluation: short side 256 (crop 0.875, bicubic), centre crop 224.
dataset_type = 'ImageNet'
data_root = 'data/imagenet'
num_classes = 1000
data_preprocessor = dict(
    num_classes=num_classes,
    mean=[123.675, 116.28, 103.53],  # timm's IMAGENET_DEFAULT_MEAN/STD x 255, RGB
    std=[58.395, 57.12, 57.375],
    to_rgb=True)
bgr_mean = data_preprocessor['mean'][::-1]
bgr_std = data_preprocessor['std'][::-1]

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandAugment', policies='timm_increasing', num_policies=2, total_level=10,
         magnitude_level=9, magnitude_std=0.5,
         hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic')),
    dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02,
         max_area_ratio=1 / 3, fill_color=bgr_mean, fill_std=bgr_std),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=256, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    pin_memory=True,
    dataset=dict(type=dataset_type, data_root=data_root, split='train', pipeline=train_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    pin_memory=True,
    dataset=dict(type=dataset_type, data_root=data_root, split='val', pipeline=test_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False))
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
