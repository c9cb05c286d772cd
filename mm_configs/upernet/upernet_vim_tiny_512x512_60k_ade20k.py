# UPerNet 60k on ADE20K 512x512 with Vim-Ti; 4 GPUs x 8 images (batch 32).
# Settings of the release (github.com/hustvl/Vim, seg/configs/vim/upernet/
# upernet_vim_tiny_24_512_slide_60k.py and seg/scripts/ft_vim_tiny_upernet.sh, whose command
# line sets lr 2e-4 and weight decay 0.1): AdamW, layer-wise lr decay 0.92 over the 24 blocks
# (ppma.mm.LayerDecayOptimWrapperConstructor: the stem 0.92**25, block i 0.92**(24 - i), the
# adapter and heads 1), no weight decay on 1-D parameters nor on what the model declares
# (positions, A_log, D), linear warm-up from 1e-6 over 1500 iterations then poly (power 1) to 0,
# drop path 0.1 (the release's default), sliding-window test (512 crops, stride 341); UPerHead
# and FCN auxiliary head at width 192 as released.
# The backbone is the released dense-prediction one (features_only Vim): no class token, the
# position embedding learned for 512x512 (resampled from the 224 checkpoint when loaded), taps
# after blocks 5, 11, 17, 23 through the adapter to strides 4/8/16/32. Difference: the taps are
# the residual stream after those blocks (the release's use_residual_as_feature=True, used for
# Vim-S); the Vim-Ti run tapped the mixer outputs.
_base_ = [
    '../_base_/models/upernet.py', '../_base_/datasets/ade20k_512x512.py',
    '../_base_/seg_runtime.py'
]
crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        type='PyramidBackbone',
        model_name='vim_tiny',
        img_size=512,
        drop_path_rate=0.1,
        # Official ImageNet-1k checkpoint Vim-Ti, downloaded first from
        # https://huggingface.co/hustvl/Vim-tiny-midclstok (override the path with
        # --cfg-options model.backbone.init_cfg.checkpoint=PATH).
        init_cfg=dict(type='Pretrained', checkpoint='data/pretrained/vim_t_midclstok_76p1acc.pth')),
    decode_head=dict(in_channels=[192, 192, 192, 192], channels=192, num_classes=150),
    auxiliary_head=dict(in_channels=192, num_classes=150),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(341, 341)))
train_dataloader = dict(batch_size=8)

train_cfg = dict(type='IterBasedTrainLoop', max_iters=60000, val_interval=6000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=60000, by_epoch=False)
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=0.1, fused=True),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.92, flat_decay_mult=0.0))
auto_scale_lr = dict(enable=False, base_batch_size=32)
