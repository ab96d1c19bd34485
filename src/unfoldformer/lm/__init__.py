"""A language model on the certified decoder (THEORY §3.11), beside a standard GPT: the application.

- `tokenizer`: a character tokenizer built from the training text;
- `data`: the tiny Shakespeare corpus (or any UTF-8 text file), split like nanoGPT (first 90 % train, last 10 %
  validation), random training windows and the whole validation split in consecutive windows;
- `model`: `LanguageModel` (token embedding + learned absolute positions, a decoder, a final norm, a tied output
  head) with `generate(prompt_ids, max_new_tokens, temperature, top_k)` through the decoder's cache;
- `train`: the training loop behind `unfoldformer lm train` (run folders, resume, metrics), `evaluate_run`.
"""
from .model import LanguageModel, LMConfig
from .tokenizer import CharTokenizer

__all__ = ["CharTokenizer", "LMConfig", "LanguageModel"]
