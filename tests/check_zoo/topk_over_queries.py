"""The indexer's selection step: keep the best-scoring entries of the index scores (B, Lq, Lk)."""


def select(index_scores, k):
    _, picked = index_scores.topk(k, dim=1)
    return picked.transpose(1, 2)
