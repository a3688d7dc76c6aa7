"""The adapter protocol and its implementations, one module each (imported by name: they pull
in torch, and :mod:`.task_names` must not)."""
