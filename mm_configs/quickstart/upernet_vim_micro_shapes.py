# Quick start: UPerNet with a micro plain Vim (random init: Vim-Ti's blocks at width 32, 4
# blocks, patch 16; the released dense-prediction adapter to strides 4/8/16/32) on the generated
# shapes (python tools/make_shapes_dataset.py data/shapes), trained on a CPU in minutes;
# evaluates mIoU at the end. Layer-wise lr decay 0.92 as the Vim-Ti UPerNet recipe; everything
# else (slim heads, 128x128 crops, 800 iterations, AdamW) as upernet_ppma_micro_shapes.py.
_base_ = './upernet_ppma_micro_shapes.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='PyramidBackbone',
        model_name='vim_tiny',
        out_indices=(0, 1, 2, 3),
        embed_dim=32,
        depth=4,
        img_size=128,
        drop_path_rate=0.0),
    decode_head=dict(in_channels=[32, 32, 32, 32]),
    auxiliary_head=dict(in_channels=32))
optim_wrapper = dict(
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(_delete_=True, layer_decay_rate=0.92, flat_decay_mult=0.0))
