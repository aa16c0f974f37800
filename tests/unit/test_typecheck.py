"""The suite runs with the workbench's array annotations checked (tests/typecheck.py)."""

import pytest
import torch

from tasks.base import Batch


def test_a_batch_whose_tensors_disagree_on_the_batch_size_is_refused_by_the_runtime_check():
    ids, flags = torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1, dtype=torch.bool)
    Batch(tokens=torch.zeros(3, 5, dtype=torch.long), labels=ids, label_pos=ids, label_mask=flags, loss_mask=flags)
    with pytest.raises(TypeError, match="batch"):
        Batch(tokens=torch.zeros(2, 5, dtype=torch.long), labels=ids, label_pos=ids, label_mask=flags, loss_mask=flags)
