"""Adapters that plug Mooring into inference engines."""
