import os

# Tests never reach a hub: every model comes from the package, the cache, or is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gc

import pytest


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test():
    """Models, runners and KV caches often sit in reference cycles; free them between tests."""
    yield
    gc.collect()
