"""Shared by tests/scripts/run_recipe.py (under accelerate launch) and the tests that read its reports."""

import hashlib


def weights_digest(model) -> str:
    """sha256 of every tensor of the model's state dict, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
