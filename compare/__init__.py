"""The comparison harness: ``python -m compare --op gelu`` (``make compare OP=gelu``).

Every variant of a tk op (eager PyTorch, hand-written compositions,
torch.compile, the tk Triton op, peer libraries) runs on the same inputs;
each is checked against a float64 reference, timed, and judged against the
device's own measured limits.  See ``compare.cli`` for the options and
``logs/README.md`` for what a run writes.
"""
