"""The data-access layer: the one place that turns intent into SQL (internal, not part of the public API)."""
