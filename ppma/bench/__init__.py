"""Measurements of the presets: speed per backend and runtime (:mod:`.benchmark`), CPU profiles
(:mod:`.profile_models`), parameters and FLOPs (:mod:`.model_stats`), accuracy on an ImageFolder
(:mod:`.validate`), error and speed against the official models (:mod:`.compare_official`), and
the GPU report (:mod:`.gpu`, ``tools/gpu_report.py``), and the ops and copies of one training step
(:mod:`.step_count`).
Each module's ``main`` is the command line of its ``tools/`` script.
"""
