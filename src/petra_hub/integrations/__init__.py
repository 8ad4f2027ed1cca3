"""petra_hub and the rest of the ecosystem: Hub model cards and uploads, timm entry points."""
