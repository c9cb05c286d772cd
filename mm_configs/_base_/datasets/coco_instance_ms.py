# COCO 2017 instance segmentation with the multi-scale + crop training of the 3x recipe
# (shorter side 480-800, or 400-600 then a 384-600 crop, as in the PPMA release).
_base_ = ['./coco_instance.py']

scales = [(1333, 480), (1333, 512), (1333, 544), (1333, 576), (1333, 608), (1333, 640),
          (1333, 672), (1333, 704), (1333, 736), (1333, 768), (1333, 800)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=scales, keep_ratio=True)],
            [
                dict(type='RandomChoiceResize',
                     scales=[(1333, 400), (1333, 500), (1333, 600)],
                     keep_ratio=True),
                dict(type='RandomCrop',
                     crop_type='absolute_range',
                     crop_size=(384, 600),
                     allow_negative_crop=True),
                dict(type='RandomChoiceResize', scales=scales, keep_ratio=True)
            ]
        ]),
    dict(type='PackDetInputs')
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
