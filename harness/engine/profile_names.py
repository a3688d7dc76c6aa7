"""The names of maskcheck's profiles, importable without Hypothesis: the command line's
parser and the pytest plugin's options list them before anything draws a case
(:mod:`.profiles` registers their settings)."""

PROFILE_NAMES = ("quick", "dev", "ci", "thorough")
