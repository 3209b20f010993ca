"""Built-in model catalog and model-shape resolution (step 2 of the pipeline).

A name matches case-insensitively on its last ``/`` segment after stripping a trailing
``-instruct``, ``-chat``, ``-base`` or ``-hf``; explicit request fields override the
catalog. Shapes come from each model's card and config.json, cited per row.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashruntime.planner import constants as K
from flashruntime.planner.unplannable import UnplannableRequest

# name -> (parameters, hidden_size, num_layers, num_attention_heads, vocab_size, tie_word_embeddings)
_ModelRow = tuple[float, int, int, int, int, bool]

MODELS: dict[str, _ModelRow] = {
    # Qwen2.5 family: parameter counts from each model card ("Number of Parameters"), shapes from config.json
    # (hidden_size, num_hidden_layers, num_attention_heads, vocab_size, tie_word_embeddings), Qwen Team 2024.
    "qwen2.5-0.5b": (0.49e9, 896, 24, 14, 151_936, True),
    "qwen2.5-1.5b": (1.54e9, 1536, 28, 12, 151_936, True),
    "qwen2.5-3b": (3.09e9, 2048, 36, 16, 151_936, True),
    "qwen2.5-7b": (7.61e9, 3584, 28, 28, 152_064, False),
    "qwen2.5-14b": (14.7e9, 5120, 48, 40, 152_064, False),
    "qwen2.5-32b": (32.5e9, 5120, 64, 40, 152_064, False),
    "qwen2.5-72b": (72.7e9, 8192, 80, 64, 152_064, False),
    # Llama 3.1: Meta model card (8B / 70B; 8.03B and 70.6B counted weights) and config.json.
    "llama-3.1-8b": (8.03e9, 4096, 32, 32, 128_256, False),
    "llama-3.1-70b": (70.6e9, 8192, 80, 64, 128_256, False),
    # Llama 3.2: Meta model card (1.23B / 3.21B) and config.json (tied embeddings).
    "llama-3.2-1b": (1.24e9, 2048, 16, 32, 128_256, True),
    "llama-3.2-3b": (3.21e9, 3072, 28, 24, 128_256, True),
    # Mistral 7B: Jiang et al. 2023, "Mistral 7B", Table 1 (dim 4096, 32 layers, 32 heads, vocab 32000);
    # 7.24B parameters per the mistralai/Mistral-7B-v0.1 model card.
    "mistral-7b": (7.24e9, 4096, 32, 32, 32_000, False),
    # Gemma 2 9B: Gemma Team 2024, "Gemma 2", Table 1 (d_model 3584, 42 layers, 16 heads, vocab 256128 in the
    # paper / 256000 in config.json); 9.24B parameters per the google/gemma-2-9b model card.
    "gemma-2-9b": (9.24e9, 3584, 42, 16, 256_000, True),
    # GPT-2: Radford et al. 2019, Table 2 (117M/345M/762M/1542M as published; config.json n_embd, n_layer,
    # n_head, vocab 50257); parameter counts as reported by the openai-community model cards (124M ... 1.5B).
    "gpt2": (0.124e9, 768, 12, 12, 50_257, True),
    "gpt2-medium": (0.355e9, 1024, 24, 16, 50_257, True),
    "gpt2-large": (0.774e9, 1280, 36, 20, 50_257, True),
    "gpt2-xl": (1.558e9, 1600, 48, 25, 50_257, True),
}

# Common spellings of the same checkpoints (after the suffix strip) -> catalog key.
ALIASES: dict[str, str] = {
    "meta-llama-3.1-8b": "llama-3.1-8b",
    "meta-llama-3.1-70b": "llama-3.1-70b",
    "mistral-7b-v0.1": "mistral-7b",
    "mistral-7b-v0.3": "mistral-7b",
    "mistral-7b-instruct-v0.1": "mistral-7b",
    "mistral-7b-instruct-v0.2": "mistral-7b",
    "mistral-7b-instruct-v0.3": "mistral-7b",
    "gemma-2-9b-it": "gemma-2-9b",
}

_STRIPPED_SUFFIXES = ("-instruct", "-chat", "-base", "-hf")


@dataclass(frozen=True)
class ModelShape:
    """What the memory and time models need to know about a transformer."""

    name: str
    params: float  # total parameter count
    hidden: int
    layers: int
    heads: int
    vocab: int
    tied_embeddings: bool
    catalog_key: str | None  # None = not in the catalog
    derived: tuple[str, ...] = ()  # fields the planner had to assume or derive

    @property
    def embedding_params(self) -> float:
        """Input embedding plus (untied) output head: the parameters QLoRA leaves in 16-bit."""
        return float(self.vocab) * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def block_params(self) -> float:
        """Parameters of one transformer block, ≈ 12·h² (Kaplan et al. 2020 §2.1)."""
        hidden = float(self.hidden)  # h * h: a float power would raise OverflowError instead of giving inf
        return K.PARAMS_PER_LAYER_PER_HIDDEN_SQUARED * hidden * hidden


def catalog_key(model: str) -> str:
    """The lookup key of ``model``: last ``/`` segment, lower-cased, one trailing suffix stripped."""
    key = model.rstrip("/").rsplit("/", 1)[-1].strip().lower()
    for suffix in _STRIPPED_SUFFIXES:
        if key.endswith(suffix):
            key = key[: -len(suffix)]
            break
    return ALIASES.get(key, key)


def resolve_model(
    model: str,
    *,
    parameters_b: float | None,
    hidden_size: int | None,
    num_layers: int | None,
) -> ModelShape:
    """Catalog shape of ``model`` with explicit request fields taking precedence.

    Raises ``UnplannableRequest`` (a ``ValueError``) for a model outside the catalog without ``parameters_b``.
    """
    key = catalog_key(model)
    row = MODELS.get(key)
    if row is None:
        if parameters_b is None:
            known = ", ".join(sorted(MODELS))
            raise UnplannableRequest(
                f"unknown model {model!r} (looked up as {key!r}): the planner needs its size. "
                f"Set workload.parameters_b (billions of parameters), and ideally hidden_size and num_layers, "
                f"or use a catalog model: {known}"
            )
        return _derived_shape(model, parameters_b * 1e9, hidden_size, num_layers)
    params, hidden, layers, heads, vocab, tied = row
    overridden: list[str] = []
    if parameters_b is not None:
        params = parameters_b * 1e9
    if hidden_size is not None and hidden_size != hidden:
        hidden = hidden_size
        heads = max(1, hidden // K.DEFAULT_HEAD_DIM)
        overridden.append("heads")
    if num_layers is not None:
        layers = num_layers
    return ModelShape(model, params, hidden, layers, heads, vocab, tied, key, tuple(overridden))


def _derived_shape(model: str, params: float, hidden: int | None, layers: int | None) -> ModelShape:
    """Fill a missing hidden size / layer count from N ≈ 12·L·h² and h = 128·L."""
    derived: list[str] = []
    per_layer = K.PARAMS_PER_LAYER_PER_HIDDEN_SQUARED
    if hidden is None and layers is None:
        # N = 12 · L · (128 L)^2  =>  L = (N / (12 · 128²))^(1/3)
        layers = max(1, round((params / (per_layer * K.HIDDEN_PER_LAYER**2)) ** (1 / 3)))
        hidden = max(64, layers * K.HIDDEN_PER_LAYER)
        derived += ["hidden_size", "num_layers"]
    elif hidden is None and layers is not None:
        hidden = max(64, round((params / (per_layer * float(layers))) ** 0.5))
        derived.append("hidden_size")
    elif layers is None and hidden is not None:
        layers = max(1, round(params / (per_layer * float(hidden) * hidden)))
        derived.append("num_layers")
    heads = max(1, hidden // K.DEFAULT_HEAD_DIM)
    derived += ["heads", "vocab"]
    return ModelShape(model, params, hidden, layers, heads, K.DEFAULT_VOCAB, False, None, tuple(derived))
