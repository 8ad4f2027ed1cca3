"""Tooling shared by petra_hub's tests and benchmarks: small models and batches, multi-process launching.

Importing this package imports nothing heavy; `petra_hub.testing.models` needs transformers (the RevNet classes),
`petra_hub.testing.ranks` only torch.
"""
