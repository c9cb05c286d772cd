# UPerNet 160k on ADE20K 512x512 with PPMA-T;
# 8 GPUs x 2 images; sliding-window test.
_base_ = [
    '../_base_/models/upernet.py', '../_base_/datasets/ade20k_512x512.py',
    '../_base_/schedules/upernet_160k.py', '../_base_/seg_runtime.py'
]
crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        model_name='ppma_tiny',
        drop_path_rate=0.1,
        # Official ImageNet-1k checkpoint (or a local/converted copy: override with
        # --cfg-options model.backbone.init_cfg.checkpoint=PATH).
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://huggingface.co/ZhongchenZhao/PPMA/resolve/main/checkpoints/classification/PPMA_T_202502251000/best.pth')),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=150),
    auxiliary_head=dict(in_channels=256, num_classes=150),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(341, 341)))
