# The DeiT training schedule of the PPMA and Vim releases (timm 0.4 scripts), for a total batch
# of 1024: AdamW lr 5e-4 x batch / 512, weight decay 0.05 except on biases, norms, 1-D
# parameters and what the model declares in no_weight_decay(); 5 warm-up epochs from 1e-6, then
# cosine to 1e-5, stepped per epoch; 300 epochs; no gradient clipping. (The releases' repeated
# augmentation, 3 repeats, is the RepeatAugSampler of their configs' train_dataloader.)
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='NoDecayOptimWrapperConstructor',  # no decay on the model's no_weight_decay()
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999), fused=True),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5, end=300),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
# tools/train.py --auto-scale-lr scales the lr linearly to the actual total batch
auto_scale_lr = dict(base_batch_size=1024)
