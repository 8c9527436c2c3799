"""Session-wide test setup: offline hubs, per-test time limits, a cheap per-test garbage
collection, and a shared read-only tiny-qwen3 and tokenizers (0.2-0.5 s to build each)."""

import os

# Tests never reach a hub: every model comes from the package, the cache, or is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import copy
import functools
import gc

import pytest

from agentic_rl.models.loader import TINY_QWEN3, build_tiny_qwen3, load_tokenizer


# pytest-timeout limit of slow and e2e tests (pyproject's `timeout` is for the rest): about 4x the
# slowest of them on a loaded 2-core machine (SFT on SmolLM2, 285 s), and above the 940 s of
# deadlines inside the pipeline test, so its own messages come first.
LONG_TIMEOUT_S = 1200


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is None and (
            item.get_closest_marker("slow") or item.get_closest_marker("e2e")
        ):
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S))


def pytest_collection_finish(session):
    """Freeze what importing the test modules built (torch, transformers, trl: ~370k objects).

    A full gc.collect() walks every tracked object: 0.15-0.25 s each with these libraries loaded,
    which made the per-test collection below 80 of the 95 s of the 348 tensor-only tests. Frozen
    objects are never walked again; they are module-level and live as long as the session anyway.
    What tests create later (models, runners, lazily imported modules) is still collected.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test():
    """Models, runners and KV caches often sit in reference cycles; free them between tests."""
    yield
    gc.collect()


def _reset_accelerator_state() -> None:
    """accelerate keeps one process-wide state: the first Accelerator's mixed precision would bind
    every later test in the process (a bf16 trainer test after a float32 one fails to start)."""
    import sys

    if "accelerate.state" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


@pytest.fixture(autouse=True, scope="module")
def _fresh_accelerator_state_for_each_module():
    """Reset accelerate's state after each module, once the module's own fixtures (a TRL trainer
    shared by its tests) are gone."""
    yield
    _reset_accelerator_state()


@pytest.fixture
def fresh_accelerator_state():
    """For a test that makes an Accelerator of another precision than its module's: reset before and after it."""
    _reset_accelerator_state()
    yield
    _reset_accelerator_state()


@pytest.fixture(scope="session")
def shared_tokenizer():
    """`shared_tokenizer(name)`: the tokenizer `load_tokenizer(name)` returns, loaded once per session.

    Shared between tests: never change one (padding side, chat template, added tokens); a test
    that must, calls `load_tokenizer` for its own copy."""
    return functools.lru_cache(maxsize=None)(load_tokenizer)


@pytest.fixture(scope="session")
def qwen3_tokenizer(shared_tokenizer):
    """The vendored Qwen3 tokenizer (tiny-qwen3's), shared and read-only."""
    return shared_tokenizer(TINY_QWEN3)


@pytest.fixture(scope="session")
def tiny_qwen3(qwen3_tokenizer):
    """(model, tokenizer): `load_model("tiny-qwen3")`, built once per session, in eval mode.

    Shared and read-only: a test that trains it, wraps it in adapters or changes its mode or dtype
    works on `new_tiny_qwen3()`, a deep copy (25 ms, against 0.2 s for a build). The session fails
    at the end if a test changed the shared parameters in place or left the model in train mode,
    since later tests would then see other weights depending on the order they ran in (writes
    through `param.data` escape this check)."""
    model = build_tiny_qwen3()
    before = [(name, p.data_ptr(), p._version) for name, p in model.named_parameters()]
    yield model, qwen3_tokenizer
    after = [(name, p.data_ptr(), p._version) for name, p in model.named_parameters()]
    assert not model.training and after == before, "a test changed the shared tiny-qwen3 in place; deep-copy it first"


@pytest.fixture(scope="session")
def new_tiny_qwen3(tiny_qwen3):
    """`new_tiny_qwen3()`: a private copy of the shared tiny-qwen3 (the weights `build_tiny_qwen3()`
    gives), to train, wrap in adapters or cast."""
    return lambda: copy.deepcopy(tiny_qwen3[0])
