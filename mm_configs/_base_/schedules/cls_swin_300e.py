# The Swin training schedule of the MLLA (MILA) and VMamba releases, for a total batch of 1024:
# AdamW lr 5e-4 x batch / 512, weight decay 0.05 except on biases, norms, 1-D parameters and
# what the model declares in no_weight_decay(); 20 warm-up epochs from lr / 1000, then cosine to
# lr / 100, both stepped per iteration; 300 epochs; gradient norm clipped at 5.
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='NoDecayOptimWrapperConstructor',  # no decay on the model's no_weight_decay()
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999), fused=True),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0),
    clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=20, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=20, end=300,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
# tools/train.py --auto-scale-lr scales the lr linearly to the actual total batch
auto_scale_lr = dict(base_batch_size=1024)
