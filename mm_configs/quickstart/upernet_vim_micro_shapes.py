# Quick start: UPerNet with a micro plain Vim (random init: Vim-Ti's blocks at width 32, 4
# blocks, patch 16; the released dense-prediction adapter to strides 4/8/16/32) on the generated
# shapes (python tools/make_shapes_dataset.py data/shapes), trained on a CPU in minutes;
# evaluates mIoU at the end. Layer-wise lr decay 0.92 as the Vim-Ti UPerNet recipe; everything
# else (slim heads, 128x128 crops, 800 iterations, AdamW) as _base_/shapes_upernet.py.
_base_ = '../_base_/shapes_upernet.py'
model = dict(
    backbone=dict(
        model_name='vim_tiny',
        embed_dim=32,
        depth=4,
        img_size=128),
    decode_head=dict(in_channels=[32, 32, 32, 32]),
    auxiliary_head=dict(in_channels=32))
optim_wrapper = dict(
    constructor='LayerDecayOptimWrapperConstructor',
    # another constructor: its paramwise_cfg replaces the base's custom_keys (_delete_)
    paramwise_cfg=dict(_delete_=True, layer_decay_rate=0.92, flat_decay_mult=0.0))
