"""Generates FMA GEMM WGSL variants for the probe beside it: C[N][M] = sum_k A[K][M] B[N][K],
the GEMM of a 1x1 NCHW convolution. Usage: python3 gen.py DIR."""
import itertools
import os
import sys

LANES = "xyzw"


def kernel(M, N, K, BM, BN, BK, TM, TN, vec_a=True, vec_b=True, vec_store=False, pad_b=0, prefetch_frag=False,
           single_stage=False):
    TX, TY = BM // TM, BN // TN
    T = TX * TY
    assert BM % TM == 0 and BN % TN == 0 and TM % 4 == 0 and TN % 4 == 0
    assert M % BM == 0 and N % BN == 0 and K % BK == 0
    a_row = BM // 4
    b_row = BN // 4 + pad_b
    stages = 1 if single_stage else 2
    name = f"b{BM}x{BN}x{BK}_t{TM}x{TN}{'_va' if vec_a else ''}{'_vb' if vec_b else ''}{'_vs' if vec_store else ''}" \
           f"{'_pb' if pad_b else ''}{'_pf' if prefetch_frag else ''}{'_ss' if single_stage else ''}"
    L = []
    w = L.append
    w(f"// gemm: {M} {N} {K}")
    w(f"// dispatch: {M // BM} {N // BN}")
    w(f"@group(0) @binding(0) var<storage, read> A: array<{'vec4<f32>' if vec_a else 'f32'}>;")
    w(f"@group(0) @binding(1) var<storage, read> B: array<{'vec4<f32>' if vec_b else 'f32'}>;")
    w(f"@group(0) @binding(2) var<storage, read_write> C: array<{'vec4<f32>' if vec_store else 'f32'}>;")
    w(f"var<workgroup> a_tile: array<vec4<f32>, {stages * BK * a_row}>;")
    w(f"var<workgroup> b_tile: array<vec4<f32>, {stages * BK * b_row}>;")
    w(f"@compute @workgroup_size({T}, 1, 1)")
    w("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32) {")
    w("    let lid = i32(lidx);")
    w(f"    let m0 = i32(wid.x) * {BM};")
    w(f"    let n0 = i32(wid.y) * {BN};")
    w(f"    let tx = lid % {TX};")
    w(f"    let ty = lid / {TX};")
    def slots(values, width, fast, slow, reg, ty):
        """Load slots for a staged step of `values` values: invocation lid + i*T takes
        (`fast` = slot % width, `slow` = slot / width); every invocation the same number."""
        count = values // T
        assert count * T == values, name
        for i in range(count):
            w(f"    let {fast}{i} = (lid + {i * T}) % {width};")
            w(f"    let {slow}{i} = (lid + {i * T}) / {width};")
            w(f"    var {reg}{i}: {ty};")
        return count

    # load slots: A along rows of M (k-major), B along rows of K (n-major)
    if vec_a:
        na = slots(BK * BM // 4, BM // 4, "am", "ak", "pa", "vec4<f32>")
    else:
        na = slots(BK * BM, BM, "am", "ak", "pa", "f32")
    if vec_b:
        nb = slots(BK * BN // 4, BK // 4, "bkq", "bn", "pb", "vec4<f32>")
    else:
        nb = slots(BK * BN, BK, "bk", "bn", "pb", "f32")
    for i in range(TM):
        for j in range(TN):
            w(f"    var acc{i}_{j}: f32 = 0.0;")

    def fetch(k0):
        for i in range(na):
            if vec_a:
                w(f"    pa{i} = A[(({k0}) + ak{i}) * {M // 4} + m0 / 4 + am{i}];")
            else:
                w(f"    pa{i} = A[(({k0}) + ak{i}) * {M} + m0 + am{i}];")
        for i in range(nb):
            if vec_b:
                w(f"    pb{i} = B[((n0 + bn{i}) * {K} + ({k0})) / 4 + bkq{i}];")
            else:
                w(f"    pb{i} = B[(n0 + bn{i}) * {K} + ({k0}) + bk{i}];")

    def store_stage(stage):
        for i in range(na):
            if vec_a:
                w(f"    a_tile[{stage} * {BK * a_row} + ak{i} * {a_row} + am{i}] = pa{i};")
            else:
                w(f"    a_tile[{stage} * {BK * a_row} + ak{i} * {a_row} + am{i} / 4][am{i} % 4] = pa{i};")
        for i in range(nb):
            if vec_b:
                for c in range(4):
                    w(f"    b_tile[{stage} * {BK * b_row} + (bkq{i} * 4 + {c}) * {b_row} + bn{i} / 4][bn{i} % 4] = pb{i}.{LANES[c]};")
            else:
                w(f"    b_tile[{stage} * {BK * b_row} + bk{i} * {b_row} + bn{i} / 4][bn{i} % 4] = pb{i};")

    def inner():
        def loads(kk, suffix):
            for q in range(TM // 4):
                w(f"        let a{q}{suffix} = a_tile[a_base + {kk * a_row + q * TX} + tx];")
            for q in range(TN // 4):
                w(f"        let b{q}{suffix} = b_tile[b_base + {kk * b_row + q * TY} + ty];")
        if prefetch_frag:
            loads(0, "_0")
        for kk in range(BK):
            if prefetch_frag:
                if kk + 1 < BK:
                    loads(kk + 1, f"_{kk + 1}")
                sfx = f"_{kk}"
            else:
                w("        {")
                loads(kk, "")
                sfx = ""
            for i in range(TM):
                for j in range(TN):
                    w(f"        acc{i}_{j} = fma(a{i // 4}{sfx}.{LANES[i % 4]}, b{j // 4}{sfx}.{LANES[j % 4]}, acc{i}_{j});")
            if not prefetch_frag:
                w("        }")

    if single_stage:
        w(f"    for (var k0: i32 = 0; k0 < {K}; k0 = k0 + {BK}) {{")
        fetch("k0")
        w("    workgroupBarrier();")
        store_stage(0)
        w("    workgroupBarrier();")
        w("    let a_base = 0;")
        w("    let b_base = 0;")
        inner()
        w("    }")
    else:
        fetch("0")
        store_stage(0)
        w("    workgroupBarrier();")
        w("    var stage: i32 = 0;")
        w(f"    for (var k0: i32 = 0; k0 < {K}; k0 = k0 + {BK}) {{")
        w(f"    let kn = min(k0 + {BK}, {K - BK});")
        fetch("kn")
        w(f"    let a_base = stage * {BK * a_row};")
        w(f"    let b_base = stage * {BK * b_row};")
        inner()
        w("    stage = 1 - stage;")
        store_stage("stage")
        w("    workgroupBarrier();")
        w("    }")
    # store: row i -> m = m0 + 4*TX*(i/4) + 4*tx + i%4 ; col j -> n = n0 + 4*TY*(j/4) + 4*ty + j%4
    for j in range(TN):
        w(f"    {{ let n = n0 + {4 * TY * (j // 4) + j % 4} + 4 * ty;")
        for q in range(TM // 4):
            mq = f"m0 + {4 * TX * q} + 4 * tx"
            if vec_store:
                comps = ", ".join(f"acc{4 * q + c}_{j}" for c in range(4))
                w(f"      C[(n * {M} + {mq}) / 4] = vec4<f32>({comps});")
            else:
                for c in range(4):
                    w(f"      C[n * {M} + {mq} + {c}] = acc{4 * q + c}_{j};")
        w("    }")
    w("}")
    return name, "\n".join(L) + "\n"


def main(out):
    os.makedirs(out, exist_ok=True)
    shapes = {"sq4096": (4096, 4096, 4096), "1x1_256to64": (100352, 64, 256), "1x1_64to256": (100352, 256, 64),
              "s2": (25088, 128, 1152)}
    configs = []
    # (BM, BN, BK, TM, TN, kwargs)
    base = [
        (128, 128, 8, 8, 8, {}), (128, 128, 16, 8, 8, {}), (128, 128, 8, 8, 8, dict(vec_a=False, vec_b=False)),
        (128, 128, 8, 8, 8, dict(vec_store=True)), (128, 128, 8, 8, 8, dict(prefetch_frag=True)),
        (128, 128, 8, 8, 8, dict(single_stage=True)), (128, 128, 8, 8, 8, dict(pad_b=1)),
        (64, 64, 8, 4, 4, {}), (64, 64, 16, 4, 4, {}), (64, 64, 8, 4, 4, dict(vec_a=False, vec_b=False)),
        (128, 64, 8, 8, 4, {}), (128, 64, 16, 8, 4, {}), (128, 64, 8, 8, 8, {}), (128, 64, 16, 8, 8, {}),
        (128, 128, 8, 8, 16, {}), (128, 128, 8, 16, 8, {}), (128, 128, 16, 16, 8, {}),
        (256, 128, 8, 16, 8, {}), (256, 128, 8, 8, 8, {}), (128, 256, 8, 8, 16, {}),
        (256, 64, 8, 8, 8, {}), (256, 64, 16, 16, 4, {}), (256, 64, 8, 16, 8, {}), (256, 64, 16, 8, 8, {}),
        (128, 128, 32, 8, 8, {}),
    ]
    n = 0
    for sname, (M, N, K) in shapes.items():
        for BM, BN, BK, TM, TN, kw in base:
            if N % BN or M % BM or K % BK:
                continue
            T = (BM // TM) * (BN // TN)
            if T < 64 or T > 256:
                continue
            try:
                name, src = kernel(M, N, K, BM, BN, BK, TM, TN, **kw)
            except AssertionError:
                continue
            with open(os.path.join(out, f"{sname}__{name}.wgsl"), "w") as f:
                f.write(src)
            n += 1
    print(n, "kernels")


if __name__ == "__main__":
    main(sys.argv[1])
