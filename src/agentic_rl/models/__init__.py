from agentic_rl.models.loader import (
    BUILTIN_MODELS,
    SMOLLM2,
    TINY_QWEN3,
    cache_dir,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

__all__ = ["BUILTIN_MODELS", "SMOLLM2", "TINY_QWEN3", "cache_dir", "load_model", "load_tokenizer", "resolve_model_path"]
