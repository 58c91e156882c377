"""Which of the learner's layers and arguments is which: projections, their roles, the argument order."""
