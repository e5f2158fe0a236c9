"""Examples that run as typed from the repository root (``examples.app.tasks:app``)."""
