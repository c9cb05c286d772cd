"""The presets outside training: official checkpoints converted to this package's layout
(:mod:`.convert_checkpoint`), exports to ONNX and ``torch.export`` (:mod:`.export`) and their
verification in ONNX Runtime (:mod:`.verify_exports`). Each module's ``main`` is the command line
of its ``tools/`` script.
"""
