"""unfoldformer: Transformer layers as certified descent steps on an explicit energy.

Implements THEORY.md (Yang, Huang, Wipf, NeurIPS 2022, "Transformers from an
Optimization Perspective"): energies (``energy``), the ρ family (``rho``), descent
steps (``steps``), unfolded models (``model``), data (``data``), the paper's
experiments (``experiments``), training (``train``) and probing of pretrained
models (``probe``).
"""

__version__ = "0.1.0"
