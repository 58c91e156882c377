"""Loading the learner's code: the file, the constructor's arguments, the forward's inputs and the probes."""
