# UPerNet 160k on Cityscapes 1024x1024 with PPMA-B;
_base_ = './upernet_ppma_tiny_1024x1024_160k_cityscapes.py'
model = dict(
    backbone=dict(
        model_name='ppma_base',
        drop_path_rate=0.4,
        init_cfg=dict(checkpoint='https://huggingface.co/ZhongchenZhao/PPMA/resolve/main/checkpoints/classification/PPMA_B_202504101400/best.pth')),
    decode_head=dict(in_channels=[80, 160, 320, 512]),
    auxiliary_head=dict(in_channels=320))
