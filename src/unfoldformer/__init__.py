"""unfoldformer: Transformer layers as certified descent steps on an explicit energy.

Implements Yang, Huang, Wipf (NeurIPS 2022), "Transformers from an Optimization Perspective"
(`docs/theory.md` maps each equation to its function and each claim to its test)::

    import unfoldformer as uf
    model = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified", d_model=64))
    out = model(x, padding_mask, return_energies=True)     # out.energies: E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾)

The core is at the root: the ρ family (`rho`), energies (`energy`), descent steps (`steps`),
layers (`layers`), the model and its config (`model`, `config`), a certified layer for your own
model (`encoder`: `CertifiedEncoderLayer`, `CertifiedEncoder`; `decoder`: the causal `CertifiedDecoderLayer`,
`CertifiedDecoder`, THEORY §3.11), saving and sharing models
(`hub`: `save_pretrained` / `from_pretrained`), descent tolerances
(`descent`), the baseline (`baselines`), the classifier (`classifier`), the paper's released
formulas (`released`) and loading a trained classifier (`inference`; trained ones ship in `zoo`). Applications are
sub-packages: `data`, `train`, `paper` (the reproduction), `probe` (pretrained models), and
the command line `cli`.
"""

# OpenMP's wait policy is left as the user (or PyTorch's default) has it, whatever the import order. Earlier versions
# set OMP_WAIT_POLICY=PASSIVE when imported before torch; measured, that made small-shape work slower at 2 threads
# than at 1 on an idle machine (every parallel region paid a wake-up) and made the library's speed depend on the
# import order (docs/results/speed.md, "Threads"). The library's forwards and energies instead size torch's thread
# count to the cores other processes leave free (`threads.free_core_threads`; `UNFOLDFORMER_THREADS=fixed` turns
# that off), which covers a shared machine in either order.

from .baselines import StandardTransformer
from .causal import DecoderOutput
from .classifier import SequenceClassifier, build_encoder
from .config import PRESETS, ModelConfig
from .decoder import CertifiedDecoder, CertifiedDecoderLayer
from .descent import descent_tolerance
from .encoder import CertifiedEncoder, CertifiedEncoderLayer
from .energy import anchor_energy, attention_energy, symmetric_ffn_energy, tied_ffn_energy
from .errors import ConfigError, UnfoldformerError
from .hub import PretrainedError, from_pretrained
from .inference import Predictor, load
from .model import EncoderOutput, UnfoldedTransformer
from .peers import Crate, EnergyTransformer
from .rho import Rho, check_rho, custom_rho, get_rho, register_rho
from .steps import anchored_attention_step, attention_step, symmetric_ffn_step, tied_ffn_step
from .version import __version__ as __version__  # (re-exported)

__all__ = [
    "ConfigError", "Crate", "EncoderOutput", "EnergyTransformer", "ModelConfig", "PRESETS", "Predictor", "Rho",
    "SequenceClassifier",
    "CertifiedDecoder", "CertifiedDecoderLayer", "CertifiedEncoder", "CertifiedEncoderLayer", "DecoderOutput",
    "PretrainedError", "from_pretrained",
    "StandardTransformer", "UnfoldedTransformer", "UnfoldformerError", "anchor_energy", "anchored_attention_step",
    "attention_energy", "attention_step", "build_encoder", "check_rho", "custom_rho", "descent_tolerance",
    "get_rho", "load", "register_rho", "symmetric_ffn_energy", "symmetric_ffn_step", "tied_ffn_energy", "tied_ffn_step",
]
