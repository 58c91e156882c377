"""`multihead check`: tell a learner whether their multi-head attention is right, and what is wrong.

    from multihead.checker import check
    report = check("my_attention.py:MyAttention", init={"d_model": 16, "num_heads": 4})
    report.passed, report.bug, report.topic, print(report)

Works without rich; only ``multihead.checker.cli`` (the terminal front end) imports it.

How a module is checked (each step is one file; nothing is taken from names alone when behaviour can
tell, and every trial verifies the output shape, so a trial that does not fit is evidence, not a crash):

1. Build it (``loading/learner_file.py``, ``loading/constructor_args.py``, ``config.py``): import the file without writing bytecode; fill
   the constructor by parameter name (d_model, hid_dim, n_state, heads, d_k...), or pass a config
   object whose attributes are given (``--config``) or guessed by name and recorded. Eval mode, dropout
   off, fresh random projection weights (``probes.randomise_projections``) and 1-D parameters (norm
   weights, sinks: ``option_search.randomise_extras``), float64 when it runs so. A plain function
   (``FILE.py:function``) becomes a module class first (``functions.py``): an attention core inside
   projections the checker supplies, or a module whose parameters are its weight arguments. A
   token-sparse attention function ``fn(q, k, v, indices)`` or a top-k selection ``fn(index_scores, k)``
   is judged as a function instead, against ``Mask.sparse`` and ``topk`` (``sparse.py``).
2. Read ``forward``'s signature (``calling.py``): how many tensor inputs, which parameter is the mask.
   A mask the module requires (it raises on None) is given an all-keep mask in its own convention
   wherever the checker calls without one (``masks.all_keep_encoding``).
3. Layout (``behaviour/layout.py``): change batch row 0 and see which dimension keeps its other outputs.
4. Argument order (``order.py``): the query is the argument whose token 0 moves output row 0 only;
   the values are the argument the output is affine in: ``forward(values, keys, query, mask)`` works.
5. Causality and cross lengths (``behaviour/layout.py``): change the last token; try Lq != Lk.
6. Mask convention (``behaviour/mask_convention.py``): every encoding (keep/block, bool/0-1/additive, each shape, valid
   lengths) is tried with a different mask per batch row; the right one makes blocked keys inert. A
   mask whose mere presence makes the module causal (values unread) is recognised first. A module that
   raises under every convention is reported by that exception (run.py). A causal module that drops its
   own causal masking when given a mask takes the complete mask (``behaviour/mask_meaning.py``, Hugging Face's 4-D
   additive one); a sliding window is read from the outputs token 0 moves (``option_search.find_window``).
7. Roles (``projections.py``, ``roles.py``): hooks record which projection (nn.Linear, a GPT-2 Conv1D,
   an inner nn.MultiheadAttention's in-projection, one Linear shared by all heads) sees the query, key
   or value input, or the output of a layer applied to it first (a LayerNorm inside the module), or
   which argument of ``F.multi_head_attention_forward`` a Linear's weight is handed to; the few
   assignments that fit (orders, fused thirds, head counts) are candidates.
8. Verdict (``verdict.py``): the candidate that reproduces the outputs with the correct maths is
   compared with ``MultiHeadAttention`` on outputs and gradients (``compare.py``), then at longer
   lengths up to 64 tokens, and a keep mask added times +1e9 is ruled out -> PASS (a module that turns q
   and k by position is compared with RoPE in the pairing it uses, ``rotary.py``; a module with a KV
   cache must then give the same rows from a prompt and single steps, ``targets/kv_cache.py``); otherwise
   the catalogue's variants (``bugs/catalogue.py``, ``bugs/diagnose.py``) and the measured scale (``scale.py``)
   name the bug (the order of those tries is in ``verdict.py``), and the mask convention is re-read
   under that bug. A mask that could not be verified never passes. A module with an absorbed path
   (``forward(x, absorb=True)``...) whose Linears fit multi-head latent attention's roles
   (``roles/latent.py``) is judged as MLA instead (``targets/latent.py``): its naive forward against MLA on its
   own weights, then its absorbed path against its naive forward. When neither plain maths nor plain
   RoPE fits, the options the module shows by behaviour (QK-norm, partial or reversed RoPE, sinks, a named
   softcap: ``options.py``) are searched (``behaviour/find_options.py``); a mistake inside them (QK-norm over the
   whole width, a window or a rotary size other than the constructor's) is named. Then the mask as
   callers pass it (``behaviour/mask_meaning.py``): a mask added with the wrong sign, a convention that breaks the
   caller's ``--call mask=...`` claim.
   When no catalogue form, scale or option explains a FAIL (or no projection roles fit), the core is judged
   on the learner's own tensors (``core/``): ``core/trace.py`` records, during one forward, the scores
   product, the softmax and the weights-times-values product (or one SDPA call) and what the output
   projection reads; ``core/stages.py`` names the first stage that differs (scores, masked scores, weights,
   per-head output, merged heads) with one row of numbers next to the expected ones, and the bug when it is
   a known one (a triu causal mask, a merge without transpose, tiled kv heads...); ``core/judge.py`` passes
   a module whose core is right when every part around it is recognised (q, k, v affine maps of the inputs,
   an output gate sigmoid(g) * attention before the output projection, every Linear used, a new last token
   changing no earlier output of a causal module), and says what it did not compare.
9. Report (``bugs/report.py``, ``bugs/sentences.py``, ``wrap.py``): the verdict, for a PASS what its mask means to a
   caller, the bug in words with its id, its explain topic, the conventions and roles found, in English
   or Chinese. An exception is matched
   against the catalogue and shown with the learner's line (``run.py`` retries once with
   Lq = Lk = head_dim, where ``q @ k`` still runs).
"""

from multihead.checker.bugs.catalogue import BUGS
from multihead.checker.bugs.report import CheckReport
from multihead.checker.run import check

__all__ = ["BUGS", "CheckReport", "check"]
