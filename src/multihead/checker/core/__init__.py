"""The attention core judged on the learner's own tensors (trace.py, stages.py)."""
