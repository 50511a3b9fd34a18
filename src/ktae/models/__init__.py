"""The models ktae knows: the embedded default model (character tokenizer, tiny Llama,
cached warm start), the named models (:mod:`ktae.models.named`), how a model directory says
it is prompted (:mod:`ktae.models.generation_defaults`) and batched generation from a
model (:mod:`ktae.models.generate`, transformers or vLLM).

Requires the ``train``/``eval`` extras (``transformers``, ``tokenizers``, ``tqdm``);
importing this package is cheap, the heavy imports happen inside the functions.
"""

from ktae.models.tiny import build_tiny_model
from ktae.models.tokenizer import ALPHABET, SPECIAL_TOKENS, build_char_tokenizer
from ktae.models.warmstart import (
    WarmStartRecipe,
    default_model_path,
    extract_boxed_int,
    greedy_accuracy,
    warm_start,
)

__all__ = [
    "ALPHABET",
    "SPECIAL_TOKENS",
    "WarmStartRecipe",
    "build_char_tokenizer",
    "build_tiny_model",
    "default_model_path",
    "extract_boxed_int",
    "greedy_accuracy",
    "warm_start",
]
