# UPerNet 160k on Cityscapes 1024x1024 with PPMA-S;
_base_ = './upernet_ppma_tiny_1024x1024_160k_cityscapes.py'
model = dict(
    backbone=dict(
        model_name='ppma_small',
        drop_path_rate=0.15,
        init_cfg=dict(checkpoint='https://huggingface.co/ZhongchenZhao/PPMA/resolve/main/checkpoints/classification/PPMA_S_202504021000/best.pth')))
