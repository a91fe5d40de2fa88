"""The in-place paged decode attention of benchmarks/attention_kernels.py, in numba (benchmark-only:
runs in .venv-bench-numba). usage: python paged_attention_numba.py IN.npz OUT.json

One parallel job per (sequence, KV head): scores of the group's query rows against the sequence's
cached keys read through the block table (only up to its own length) and its new key, softmax, and
the weighted values, all without copying the pool.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numba as nb
import numpy as np


@nb.njit(parallel=True, fastmath=True, cache=False)
def paged_decode(q, k_new, v_new, pool_k, pool_v, tables, ctx, out):
    # q [S, KVH, G, D] pre-scaled; k_new/v_new [S, KVH, D]; out [S, KVH, G, D]
    nseq, kvh, g, d = q.shape
    blk = pool_k.shape[2]
    for job in nb.prange(nseq * kvh):
        s = job // kvh
        h = job % kvh
        n = ctx[s]
        scores = np.empty((g, n + 1), dtype=np.float32)
        for j in range(n):
            b = tables[s, j // blk]
            o = j % blk
            for r in range(g):
                acc = np.float32(0.0)
                for x in range(d):
                    acc += q[s, h, r, x] * pool_k[h, b, o, x]
                scores[r, j] = acc
        for r in range(g):
            acc = np.float32(0.0)
            for x in range(d):
                acc += q[s, h, r, x] * k_new[s, h, x]
            scores[r, n] = acc
        for r in range(g):
            m = scores[r, 0]
            for j in range(1, n + 1):
                if scores[r, j] > m:
                    m = scores[r, j]
            tot = np.float32(0.0)
            for j in range(n + 1):
                e = np.exp(scores[r, j] - m)
                scores[r, j] = e
                tot += e
            for x in range(d):
                out[s, h, r, x] = 0.0
            for j in range(n):
                b = tables[s, j // blk]
                o = j % blk
                p = scores[r, j] / tot
                for x in range(d):
                    out[s, h, r, x] += p * pool_v[h, b, o, x]
            p = scores[r, n] / tot
            for x in range(d):
                out[s, h, r, x] += p * v_new[s, h, x]



def main() -> None:
    data = np.load(sys.argv[1])
    nb.set_num_threads(2)
    q = np.ascontiguousarray(data["q"].transpose(1, 0, 2, 3))  # [S, KVH, G, D]
    k_new = np.ascontiguousarray(data["k"][:, :, 0].transpose(1, 0, 2))
    v_new = np.ascontiguousarray(data["v"][:, :, 0].transpose(1, 0, 2))
    out = np.empty_like(q)
    args = (q, k_new, v_new, data["pool_k"], data["pool_v"], data["tables"], data["ctx"], out)
    paged_decode(*args)
    times = []
    for _ in range(30):
        start = time.perf_counter()
        paged_decode(*args)
        times.append((time.perf_counter() - start) * 1e3)
    np.save(sys.argv[2] + ".npy", out.transpose(1, 0, 2, 3))
    with open(sys.argv[2], "w") as fh:
        json.dump({"ms": statistics.median(times), "numba": nb.__version__}, fh)


if __name__ == "__main__":
    main()
