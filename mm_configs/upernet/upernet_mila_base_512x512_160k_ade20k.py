# UPerNet 160k on ADE20K 512x512 with MILA-B (MLLA-B); 8 GPUs x 2 images.
# Settings of the release (github.com/LeapLabTHU/MLLA, downstream/segmentation/configs/mlla/
# mlla_b_upernet.py): AdamW lr 6e-5, weight decay 0.01, no decay on *norm* parameters, linear
# warm-up from 1e-6 over 1500 iterations then poly (power 1) to 0, drop path 0.5, whole-image
# test (the release's UPerNet base); heads as released (UPerHead 512, FCN auxiliary on stage 3).
# The released backbone has a LayerNorm on each output; features_only MILA models have them too.
_base_ = [
    '../_base_/models/upernet.py', '../_base_/datasets/ade20k_512x512.py',
    '../_base_/schedules/upernet_160k.py', '../_base_/seg_runtime.py'
]
crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        type='PyramidBackbone',
        model_name='mila_base',
        drop_path_rate=0.5,
        # Official ImageNet-1k checkpoint MLLA-B, downloaded first from
        # https://cloud.tsinghua.edu.cn/f/91c85c5a1061496d8796/?dl=1 (override the path with
        # --cfg-options model.backbone.init_cfg.checkpoint=PATH).
        init_cfg=dict(type='Pretrained', checkpoint='data/pretrained/mlla_b.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150),
    test_cfg=dict(mode='whole'))
optim_wrapper = dict(optimizer=dict(weight_decay=0.01))
