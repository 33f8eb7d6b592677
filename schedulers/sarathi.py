"""Sarathi and its variants (InferMax Table 1): decodes first.

Groups: running decodes, running (partially prefilled) requests, waiting
requests. Decodes that cannot get a KV slot evict lowest-priority running
requests. Variants: P=512 with chunked prefill and hybrid batches (Sarathi),
P=C (sarathi-pc), no chunked prefill (sarathi-nocp), no hybrid batches and no
chunked prefill (sarathi-nohy). Sarathi-real: Sarathi as deployed (and as Vidur
simulates it): a token budget of 512 per batch that decodes count against too,
KV in blocks of 16 tokens and a 1 % admission watermark.
"""
from .presets import register_family, register_preset

register_family("sarathi", "Sarathi: decode priority, hybrid batching, chunked prefill, P=512",
                priority="decode", hybrid=True, chunked_prefill=True, P=512)
register_family("sarathi-pc", "Sarathi P=C: decode priority, hybrid batching, chunked prefill, P=C",
                priority="decode", hybrid=True, chunked_prefill=True)
register_family("sarathi-nocp", "Sarathi-nocp: decode priority, hybrid batching, no chunked prefill, P=C",
                priority="decode", hybrid=True, chunked_prefill=False)
register_family("sarathi-nohy", "Sarathi-nohy: decode priority, no hybrid batching, no chunked prefill, P=C",
                priority="decode", hybrid=False, chunked_prefill=False)
register_preset("sarathi-real", "Sarathi as deployed: 512-token budget counting decodes, KV blocks of 16 tokens, "
                "a 1 % admission watermark", priority="decode", hybrid=True, chunked_prefill=True, P=512, C=512)
