# UPerNet 160k on ADE20K 512x512 with MILA-S (MLLA-S); 8 GPUs x 2 images.
# NOT RELEASED: the MLLA release has a segmentation config for MLLA-B only and the paper
# reports no MLLA-S ADE20K result. This is the released MLLA-B recipe
# (upernet_mila_base_512x512_160k_ade20k.py: AdamW lr 6e-5, weight decay 0.01, 160k poly) with
# MILA-S's ImageNet drop path 0.3 (as MLLA-B's 0.5 is its ImageNet value) -- an unverified choice.
_base_ = './upernet_mila_base_512x512_160k_ade20k.py'
model = dict(
    backbone=dict(
        model_name='mila_small',
        drop_path_rate=0.3,
        # MLLA-S: https://cloud.tsinghua.edu.cn/f/0e5d0b1409d540aaa80c/?dl=1
        init_cfg=dict(checkpoint='data/pretrained/mlla_s.pth')),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))
