# The generated shapes set (tools/make_shapes_dataset.py) as COCO instance segmentation.
dataset_type = 'CocoDataset'
data_root = 'data/shapes/'
metainfo = dict(
    classes=('circle', 'square', 'triangle'),
    palette=[(220, 20, 60), (0, 128, 255), (255, 200, 0)])
image_size = (128, 128)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_training.json',
        data_prefix=dict(img='images/training/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=4),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_validation.json',
        data_prefix=dict(img='images/validation/'),
        test_mode=True,
        pipeline=test_pipeline))
test_dataloader = val_dataloader

val_evaluator = dict(
    type='CocoMetric',
    ann_file=data_root + 'annotations/instances_validation.json',
    metric=['bbox', 'segm'],
    format_only=False)
test_evaluator = val_evaluator
