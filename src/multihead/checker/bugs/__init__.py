"""The bugs: the catalogue, naming the one that reproduces the outputs, and every sentence in EN and ZH."""
