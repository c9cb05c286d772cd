# UPerNet 160k on ADE20K 512x512 with VMamba-S [s2l15], preset vmamba_small_s2l15; 8 GPUs x 2
# images. The release's settings (github.com/MzeroMiko/VMamba, segmentation/configs/vssm1/
# upernet_vssm_4xb4-160k_ade20k-512x512_small.py): VMamba-T's recipe with drop path 0.3.
_base_ = './upernet_vmamba_tiny_512x512_160k_ade20k.py'
model = dict(
    backbone=dict(
        model_name='vmamba_small_s2l15',
        drop_path_rate=0.3,
        # Official ImageNet-1k checkpoint VMamba-S [s2l15], downloaded first from
        # https://github.com/MzeroMiko/VMamba/releases/download/%23v2cls/vssm_small_0229_ckpt_epoch_222.pth
        init_cfg=dict(checkpoint='data/pretrained/vssm_small_0229_ckpt_epoch_222.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
