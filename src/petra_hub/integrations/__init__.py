"""petra_hub and the rest of the ecosystem. Import the module you need; this package imports none of them.

- :mod:`petra_hub.integrations.model_card`: :class:`TrainingSummary` and the model card it renders.
- :mod:`petra_hub.integrations.hub`: Hub-ready folders (:func:`save_for_hub`) and uploads (:func:`push_folder_to_hub`).
- :mod:`petra_hub.integrations.timm`: ``revnet18`` .. ``revnet101`` and ``revvit_tiny`` .. ``revvit_base``
  (:mod:`~petra_hub.integrations.timm_revvit`) as timm models, registered with timm on import.
"""
