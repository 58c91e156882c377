"""The one exception every bad input raises."""


class AttentionError(ValueError):
    """Bad input to multihead: the message says what was expected and what came."""


def shape_str(shape) -> str:
    """`(2, 7)` for a torch.Size or tuple, the form every error message uses."""
    dims = tuple(int(d) for d in shape)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"
