"""Every model source loads and generates; the embedded-model cache is rebuilt when corrupt."""

import json

import pytest
import torch

from agentic_rl.models import load_model, resolve_model_path
from agentic_rl.models import loader


def _greedy(model, tokenizer, n=5):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, ids["input_ids"].shape[1] :]


def test_tiny_qwen3_loads_with_real_tokenizer_and_generates():
    """Guards against the test model drifting from Qwen3: tiny-qwen3's shape, its vendored tokenizer's ids and
    tool-aware chat template, and that it generates."""
    model, tokenizer = load_model("tiny-qwen3")
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert tokenizer.convert_tokens_to_ids("<tool_call>") == 151657
    assert tokenizer.encode("Hello world") == [9707, 1879]
    assert "tools" in tokenizer.chat_template
    assert len(_greedy(model, tokenizer)) == 5


def test_tiny_qwen3_is_seeded():
    """Guards against tests that pass or fail by chance because the random model differs per run."""
    a, _ = load_model("tiny-qwen3")
    b, _ = load_model("tiny-qwen3")
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_local_directory_loads(tmp_path):
    """Guards against a saved model folder loading other weights or another tokenizer: greedy output is
    identical after save and load."""
    model, tokenizer = load_model("tiny-qwen3")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    again, tok_again = load_model(str(tmp_path))
    assert torch.equal(_greedy(model, tokenizer), _greedy(again, tok_again))


def test_unknown_model_name_is_explained():
    """Guards against an unknown model name trying the hub offline and failing obscurely: the message lists what
    a name can be."""
    with pytest.raises(ValueError, match="not a local directory, not a hub id"):
        resolve_model_path("gpt-17")


def test_directory_without_config_is_explained(tmp_path):
    """Guards against a folder without config.json being treated as a model and failing later inside transformers."""
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_cache_validation_rejects_partial_and_corrupt_caches(tmp_path):
    """Guards against loading a half-written or bit-flipped cache instead of rebuilding it."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    assert not loader._cache_is_valid(folder)  # no manifest: partial
    loader._write_manifest(folder)
    assert loader._cache_is_valid(folder)
    (folder / "model.safetensors").write_bytes(b"\x01" + b"\x00" * 63)  # same size, other bytes
    assert not loader._cache_is_valid(folder)
    loader._write_manifest(folder)
    (folder / "model.safetensors").unlink()
    assert not loader._cache_is_valid(folder)
    (folder / loader._MANIFEST).write_text("not json")
    assert not loader._cache_is_valid(folder)


def test_a_verified_cache_is_hashed_once_until_a_file_changes(tmp_path, monkeypatch):
    """Guards against re-hashing SmolLM2's 538 MB at every load (about 1 s each), and against the
    per-process memo trusting a file that changed after it was hashed."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    loader._write_manifest(folder)
    hashed = []
    digest = loader._file_digest
    monkeypatch.setattr(loader, "_file_digest", lambda path: hashed.append(path.name) or digest(path))

    assert loader._cache_is_valid(folder) and len(hashed) == 2
    assert loader._cache_is_valid(folder) and len(hashed) == 4  # just written: too recent to remember
    seconds_later = loader.time.time_ns() + 10 * loader._RACY_NS
    monkeypatch.setattr(loader.time, "time_ns", lambda: seconds_later)
    assert loader._cache_is_valid(folder) and len(hashed) == 6
    assert loader._cache_is_valid(folder) and len(hashed) == 6  # unchanged: remembered, not hashed
    (folder / "model.safetensors").write_bytes(b"\x01" * 65)  # any change moves size/ctime/inode
    assert not loader._cache_is_valid(folder)


@pytest.mark.slow
def test_smollm2_builds_cache_rebuilds_after_corruption_and_generates(tmp_path, monkeypatch):
    """Guards against loading corrupt cached weights (invariant 8: checksummed data): a flipped byte fails the
    manifest and the cache is rebuilt byte-identical."""
    monkeypatch.setenv("AGENTIC_RL_CACHE", str(tmp_path))
    model, tokenizer = load_model("smollm2-135m-instruct")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.dtype == torch.float32
    first = _greedy(model, tokenizer, n=8)
    assert tokenizer.decode(first).strip().startswith("2 + 3 = 5")
    weights = tmp_path / "smollm2-135m-instruct" / "model.safetensors"
    with open(weights, "r+b") as handle:  # corrupt a byte in the middle
        handle.seek(weights.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))
    manifest = json.loads((weights.parent / loader._MANIFEST).read_text())
    assert not loader._cache_is_valid(weights.parent)
    again, tok_again = load_model("smollm2-135m-instruct")
    assert loader._cache_is_valid(weights.parent)
    assert (
        json.loads((weights.parent / loader._MANIFEST).read_text())["model.safetensors"]
        == manifest["model.safetensors"]
    )
    assert torch.equal(first, _greedy(again, tok_again, n=8))
