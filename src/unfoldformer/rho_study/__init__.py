"""The ρ study: what the attention penalty ρ changes (THEORY §4; the paper's fifth question).

For every ρ (exp = softmax, log(z + 2), ℓ_p, truncated, linear, or a user `custom_rho`), on real
sentences with frozen MiniLM embeddings, for random-init models (identical weights across ρ) and
trained ones: the kernel each head applies (weight against distance, row entropy, share on the
nearest tokens, attention maps), token diversity over repeated steps with and without the anchor
½‖Y − X‖² (cosine similarity, effective rank, spread), the energy curves, and accuracy and speed
read from the accuracy benchmark's files. `run_rho_study(RhoStudySettings(...))` writes figures,
`rho_study.md` and `results.json`; `unfoldformer rho-study` is its command.
"""
from .report import run_rho_study
from .settings import RhoStudySettings

__all__ = ["RhoStudySettings", "run_rho_study"]
