# Quick start: UPerNet with a micro MILA (1.9 M backbone parameters, random init: MILA-T's
# blocks at widths 32-256, depths 1-1-2-1) on the generated shapes
# (python tools/make_shapes_dataset.py data/shapes), trained on a CPU in minutes;
# evaluates mIoU at the end. Everything else (slim heads, 128x128
# crops, 800 iterations, AdamW) as upernet_ppma_micro_shapes.py.
_base_ = './upernet_ppma_micro_shapes.py'
model = dict(
    backbone=dict(
        type='PyramidBackbone',
        model_name='mila_tiny',
        embed_dims=(32, 64, 128, 256),
        depths=(1, 1, 2, 1),
        num_heads=(1, 2, 4, 8),
        drop_path_rate=0.0),
    decode_head=dict(in_channels=[32, 64, 128, 256]),
    auxiliary_head=dict(in_channels=128))
