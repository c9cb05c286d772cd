"""What the Triton kernels share: the runtime decision (:mod:`.runtime`, importable without
Triton) and strided-addressing helpers (:mod:`.strided`, needs Triton)."""
