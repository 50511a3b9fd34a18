"""The embedded default model: character tokenizer, tiny Llama, cached warm start.

Requires the ``train``/``eval`` extras (``transformers``, ``tokenizers``); importing this
package is cheap, the heavy imports happen inside the functions.
"""

from ktae.models.tiny import build_tiny_model
from ktae.models.tokenizer import ALPHABET, SPECIAL_TOKENS, build_char_tokenizer

__all__ = ["ALPHABET", "SPECIAL_TOKENS", "build_char_tokenizer", "build_tiny_model"]
