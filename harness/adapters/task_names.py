"""The tasks an ``hf:`` spec loads, importable without torch: the command line's parser lists
them before any model is loaded (harness/adapters/hf_loading.py loads each)."""

#: the tasks whose models end in a vocabulary head
LM_TASKS: tuple[str, ...] = ("causal-lm", "masked-lm", "seq2seq")
#: the tasks of models that end elsewhere: a classifier per row (reward and regression heads
#: included), per token, and the base model whose hidden states embedding pipelines pool
HEAD_TASKS: tuple[str, ...] = ("sequence-classification", "token-classification", "feature-extraction")
TASKS: tuple[str, ...] = LM_TASKS + HEAD_TASKS
