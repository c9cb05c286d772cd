# Runtime shared by the classification configs (mmpretrain): registries, hooks, logging, and
# ppma's classifier (PresetClassifier) and class-count check (ppma/mm/classification.py).
default_scope = 'mmpretrain'
custom_imports = dict(imports=['ppma.mm.classification'], allow_failed_imports=False)

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3, save_best='auto'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='VisualizationHook', enable=False))
# Configs that add hooks (EMAHook) repeat this list: lists are replaced, not merged.
custom_hooks = [dict(type='ClassCountCheckHook')]

env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'))

vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='UniversalVisualizer', vis_backends=vis_backends)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=None, deterministic=False)
