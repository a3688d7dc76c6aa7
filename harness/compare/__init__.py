"""Two implementations of one model, compared on every suite's cases (``maskcheck compare``).

``paired.py`` runs every model call a suite makes on both; ``layers.py`` finds the first
module where they part; ``weights.py`` loads one model's weights into the other under a
key mapping; ``run.py`` drives the suites and reports.
"""
