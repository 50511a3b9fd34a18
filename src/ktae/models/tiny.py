"""The tiny Llama-architecture causal LM behind the embedded default model (issue 5)."""

from __future__ import annotations


def build_tiny_model(tokenizer, *, hidden_size: int = 128, num_layers: int = 4,
                     intermediate_size: int = 384, num_heads: int = 4, seed: int = 0,
                     max_position_embeddings: int = 128):
    """A randomly initialised :class:`~transformers.LlamaForCausalLM` sized for ``tokenizer``.

    Defaults give about 0.87M parameters (4 layers of width 128, FFN 384, 4 heads, tied
    input/output embeddings over the 100-token character vocabulary). The config carries
    the tokenizer's ``bos/eos/pad`` ids, and so does the generation config, so ``generate``
    stops at ``<eos>``. Initialisation is deterministic for ``seed`` (the global torch RNG
    is reseeded, then restored).
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers),
                        ("intermediate_size", intermediate_size), ("num_heads", num_heads),
                        ("max_position_embeddings", max_position_embeddings)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
        raise ValueError(f"num_heads: expected a divisor of hidden_size={hidden_size} with an "
                         f"even head size, got {num_heads}")
    ids = {k: getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad")}
    if any(v is None for v in ids.values()):
        raise ValueError(f"tokenizer: expected bos, eos and pad tokens, got ids {ids}")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        intermediate_size=intermediate_size, num_attention_heads=num_heads,
        num_key_value_heads=num_heads, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
        pad_token_id=ids["pad"])
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    return model
