"""--compile on a GPU changes speed, not training: with gradient accumulation the compiled model's gradients
are the eager model's."""
import pytest

from gpu_helpers import MODEL_NAMES, model_args
from helpers import assert_compiled_gradients_equal_eager

BATCH = 8


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_compiled_accumulated_gradients_equal_eager(model):
    """Two experiments from the same arguments and seed (dropout 0, learning rate 0), one with --compile, on
    cuda, take one train_step over the same 2 micro-batches (--accumulation_steps 2) and every parameter's
    .grad agrees (rtol 1e-4, atol 1e-6)."""
    argv = [*model_args(model), "--dropout", 0, "--learning_rate", 0, "--accumulation_steps", 2, "--batch_size", BATCH]
    device = assert_compiled_gradients_equal_eager(argv, BATCH, model)
    assert device.type == "cuda"
