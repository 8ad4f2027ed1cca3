"""Tests of petra_hub.data (all offline)."""
