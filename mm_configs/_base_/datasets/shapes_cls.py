# The generated shapes ImageFolder (python tools/make_shapes_dataset.py data/shapes):
# data/shapes/classification/{train,val}/{circle,square,triangle}/*.jpg, 64x64 images.
dataset_type = 'CustomDataset'
data_root = 'data/shapes/classification'
num_classes = 3
img_size = 64
data_preprocessor = dict(
    num_classes=num_classes,
    mean=[123.675, 116.28, 103.53],  # the presets' pretrained cfg (ImageNet), as tools/validate.py
    std=[58.395, 57.12, 57.375],
    to_rgb=True)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=img_size, crop_ratio_range=(0.6, 1.0), backend='pillow',
         interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=img_size, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=img_size),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=32,
    num_workers=2,
    persistent_workers=True,
    dataset=dict(type=dataset_type, data_root=data_root, data_prefix='train', pipeline=train_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(
    batch_size=50,
    num_workers=2,
    persistent_workers=True,
    dataset=dict(type=dataset_type, data_root=data_root, data_prefix='val', pipeline=test_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False))
val_evaluator = dict(type='Accuracy', topk=(1,))  # three classes: top-5 says nothing
test_dataloader = val_dataloader
test_evaluator = val_evaluator
