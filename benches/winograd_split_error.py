"""The error of wcoop's split pair ("highest", F(2x2)) in a numerical model, on the CPU: x and w
scaled by powers of two to just under 2^12, the transforms in float32, each transformed value
split into hi (its top 11 significant bits) and lo = f16((v - hi) * 2^11), the products hi*hi
+ (hi*lo + lo*hi) / 2^11 summed in float32 (tensor cores multiply f16 exactly), the inverse
transform, against the direct float64 sum; max |error| / max |y| per reduction length.
"highest"'s bound is 1e-5, the tuner validates at 5e-6.

Usage: python benches/winograd_split_error.py
"""

import numpy as np
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, -1, 0, 1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, 1]], np.float64)
def hi_part(v):
    b = v.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return b.view(np.float32)
def split(v):
    v = v.astype(np.float32)
    h = hi_part(v).astype(np.float16)
    l = ((v - h.astype(np.float32)) * np.float32(2048)).astype(np.float16)
    return h, l
rng = np.random.default_rng(0)
for C in (8, 64, 256, 512):
    errs = []
    for trial in range(3):
        K, T = 16, 64
        d = rng.standard_normal((T, C, 4, 4))     # patches
        g = rng.standard_normal((K, C, 3, 3))
        sx = 2.0 ** (12 - np.frexp(np.abs(d).max())[1]); sw = 2.0 ** (12 - np.frexp(np.abs(g).max())[1])
        V = np.einsum('ij,tcjk,lk->tcil', BT, (d * sx).astype(np.float32).astype(np.float64), BT).astype(np.float32)
        U = np.einsum('ij,kcjl,ml->kcim', G, (g * sw).astype(np.float32).astype(np.float64), G).astype(np.float32)
        vh, vl = split(V); uh, ul = split(U)
        f = lambda a: a.astype(np.float32)
        # per plane GEMMs, f32 accumulation (sum order: numpy's, in f32)
        M = np.einsum('tcij,kcij->tkij', f(vh), f(uh), dtype=np.float32)
        cor = np.einsum('tcij,kcij->tkij', f(vh), f(ul), dtype=np.float32) + np.einsum('tcij,kcij->tkij', f(vl), f(uh), dtype=np.float32)
        Mt = (M + cor / np.float32(2048)).astype(np.float32)
        y = np.einsum('ij,tkjl,ml->tkim', AT, Mt.astype(np.float64), AT) / (sx * sw)
        # float64 reference: direct correlation of each patch
        ref = np.zeros((T, K, 2, 2))
        for a in range(2):
            for b in range(2):
                ref[:, :, a, b] = np.einsum('tcrs,kcrs->tk', d[:, :, a:a + 3, b:b + 3], g)
        errs.append(np.abs(y - ref).max() / np.abs(ref).max())
    print(f"C={C}: split-pair F(2x2) max rel err {max(errs):.2e}")
