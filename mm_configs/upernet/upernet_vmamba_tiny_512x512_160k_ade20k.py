# UPerNet 160k on ADE20K 512x512 with VMamba-T [s1l8], preset vmamba_tiny; 8 GPUs x 2 images
# (the release: 4 x 4, the same total batch).
# Settings of the release (github.com/MzeroMiko/VMamba, segmentation/configs/vssm1/
# upernet_vssm_4xb4-160k_ade20k-512x512_tiny.py, on mmseg's Swin UPerNet 160k config): AdamW
# lr 6e-5, weight decay 0.01, no decay on *norm* parameters, linear warm-up from 1e-6 over 1500
# iterations then poly (power 1) to 0, drop path 0.2, UPerHead 512 and FCN auxiliary head on stage 3.
# Not as released: no weight decay on SS2D's A_logs, Ds, dt_projs_bias (the model's
# no_weight_decay(); the release's mmengine constructor decays them).
# The released backbone has a LayerNorm on each output; features_only VMamba models have them too.
_base_ = [
    '../_base_/models/upernet.py', '../_base_/datasets/ade20k_512x512.py',
    '../_base_/schedules/upernet_160k.py', '../_base_/seg_runtime.py'
]
crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        type='PyramidBackbone',
        model_name='vmamba_tiny',
        drop_path_rate=0.2,
        # Official ImageNet-1k checkpoint VMamba-T [s1l8], downloaded first from
        # https://github.com/MzeroMiko/VMamba/releases/download/%23v2cls/vssm1_tiny_0230s_ckpt_epoch_264.pth
        # (override the path with --cfg-options model.backbone.init_cfg.checkpoint=PATH).
        init_cfg=dict(type='Pretrained', checkpoint='data/pretrained/vssm1_tiny_0230s_ckpt_epoch_264.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150),
    test_cfg=dict(mode='whole'))
optim_wrapper = dict(optimizer=dict(weight_decay=0.01))
