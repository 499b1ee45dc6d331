// convtune: output checks that stay on the GPU, so validating a tuning candidate costs a
// dispatch instead of a read-back of the whole output.
//
// `fill` writes the poison pattern into an output before a checked run. `compare` folds,
// over all elements, what the host-side check needs: the largest |got - want| where both
// are finite, the largest finite |want|, and how many elements are non-finite where the
// reference holds something else. NaN tests use the bits: a compiler may assume no NaN.
// `maxabs` writes max |x| and max |w| over finite elements into stats[0] and stats[1], for
// kernels that scale their inputs (coop.wgsl); `maxabs4` does the same reading x 16 bytes at
// a time (13% off a 1x1 layer's time on the H100, whose x of 100 MB the scalar pass read
// word by word). Buffers are read as words: float32 elements
// are one each, float16 elements two (`fill16`, `compare16`; the core language unpacks them,
// so this module needs no f16 extension).

@group(0) @binding(3) var<storage, read_write> poisoned: array<u32>;

@group(0) @binding(0) var<storage, read> got: array<u32>;
@group(0) @binding(1) var<storage, read> want: array<u32>;
// [0]: bits of the largest difference, [1]: bits of the largest |want|, [2]: bad elements
@group(0) @binding(2) var<storage, read_write> stats: array<atomic<u32>, 4>;

const POISON: u32 = {{POISON}}u;
const POISON16: u32 = {{POISON16}}u;  // two float16 NaNs
const EXP_MASK: u32 = 0x7f800000u;
const ABS_MASK: u32 = 0x7fffffffu;
const THREADS: u32 = {{THREADS}}u;

@compute @workgroup_size(256, 1, 1)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&poisoned);
    for (var i = gid.x; i < n; i = i + THREADS) {
        poisoned[i] = POISON;
    }
}

@compute @workgroup_size(256, 1, 1)
fn fill16(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&poisoned);
    for (var i = gid.x; i < n; i = i + THREADS) {
        poisoned[i] = POISON16;
    }
}

// x seen as whole vec4s (its tail words through `got`), for `maxabs4`.
@group(0) @binding(4) var<storage, read> got4: array<vec4<u32>>;

var<workgroup> wg_max: array<atomic<u32>, 2>;

// max over finite elements of `v`'s words, as bits.
fn finite_max4(v: vec4<u32>) -> u32 {
    let b = v & vec4<u32>(ABS_MASK);
    let f = select(vec4<u32>(0u), b, b < vec4<u32>(EXP_MASK));
    return max(max(f.x, f.y), max(f.z, f.w));
}

// Zeroes the workgroup's maxima before its invocations fold into them.
fn reset_max(lid: u32) {
    if (lid == 0u) {
        atomicStore(&wg_max[0], 0u);
        atomicStore(&wg_max[1], 0u);
    }
    workgroupBarrier();
}

// Folds a workgroup's maxima into stats[slot]: a few thousand global atomics instead of one
// per invocation.
fn fold_max(lid: u32, slot: u32, mx: u32) {
    atomicMax(&wg_max[slot], mx);
    workgroupBarrier();
    if (lid == 0u) {
        atomicMax(&stats[slot], atomicLoad(&wg_max[slot]));
    }
}

fn max_of_w(first: u32) -> u32 {
    var mw: u32 = 0u;
    for (var i = first; i < arrayLength(&want); i = i + THREADS) {
        let b = want[i] & ABS_MASK;
        if (b < EXP_MASK) { mw = max(mw, b); }
    }
    return mw;
}

@compute @workgroup_size(256, 1, 1)
fn maxabs4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    reset_max(lid);
    let n4 = arrayLength(&got4);
    var mx: u32 = 0u;
    for (var i = gid.x; i < n4; i = i + THREADS) {
        mx = max(mx, finite_max4(got4[i]));
    }
    let tail = 4u * n4 + gid.x;
    if (tail < arrayLength(&got)) {
        let b = got[tail] & ABS_MASK;
        if (b < EXP_MASK) { mx = max(mx, b); }
    }
    fold_max(lid, 0u, mx);
    fold_max(lid, 1u, max_of_w(gid.x));
}

@compute @workgroup_size(256, 1, 1)
fn maxabs(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    reset_max(lid);
    var mx: u32 = 0u;
    for (var i = gid.x; i < arrayLength(&got); i = i + THREADS) {
        let b = got[i] & ABS_MASK;
        if (b < EXP_MASK) { mx = max(mx, b); }
    }
    fold_max(lid, 0u, mx);
    fold_max(lid, 1u, max_of_w(gid.x));
}

@compute @workgroup_size(256, 1, 1)
fn compare(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&got);
    var max_diff: u32 = 0u;
    var max_want: u32 = 0u;
    var bad: u32 = 0u;
    for (var i = gid.x; i < n; i = i + THREADS) {
        let g = got[i];
        let w = want[i];
        let w_finite = (w & EXP_MASK) != EXP_MASK;
        let g_finite = (g & EXP_MASK) != EXP_MASK;
        let w_nan = (w & ABS_MASK) > EXP_MASK;
        if (!w_nan && !g_finite && g != w) {
            bad = bad + 1u;
        }
        if (w_finite && g_finite) {
            // Non-negative floats order like their bits.
            max_diff = max(max_diff, bitcast<u32>(abs(bitcast<f32>(g) - bitcast<f32>(w))));
            max_want = max(max_want, w & ABS_MASK);
        }
    }
    atomicMax(&stats[0], max_diff);
    atomicMax(&stats[1], max_want);
    atomicAdd(&stats[2], bad);
}

// The same fold over float16 elements, two per word. A float16 buffer's last word may hold
// one element and a pad half, which both outputs have poisoned (NaN in `want`: not judged).
const EXP16: u32 = 0x7c00u;
const ABS16: u32 = 0x7fffu;

@compute @workgroup_size(256, 1, 1)
fn compare16(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = arrayLength(&got) * 2u;
    var max_diff: u32 = 0u;
    var max_want: u32 = 0u;
    var bad: u32 = 0u;
    for (var i = gid.x; i < n; i = i + THREADS) {
        let shift = 16u * (i % 2u);
        let g = (got[i / 2u] >> shift) & 0xffffu;
        let w = (want[i / 2u] >> shift) & 0xffffu;
        let w_finite = (w & EXP16) != EXP16;
        let g_finite = (g & EXP16) != EXP16;
        let w_nan = (w & ABS16) > EXP16;
        if (!w_nan && !g_finite && g != w) {
            bad = bad + 1u;
        }
        if (w_finite && g_finite) {
            let gv = unpack2x16float(g).x;
            let wv = unpack2x16float(w).x;
            max_diff = max(max_diff, bitcast<u32>(abs(gv - wv)));
            max_want = max(max_want, bitcast<u32>(abs(wv)));
        }
    }
    atomicMax(&stats[0], max_diff);
    atomicMax(&stats[1], max_want);
    atomicAdd(&stats[2], bad);
}
