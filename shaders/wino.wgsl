// convtune: Winograd F(mxm, 3x3) convolution, m = {{MT}} (3x3 filters, stride 1, dilation 1).
//
// Each mxm block of outputs ("tile") of one image comes from the pxp input patch above it
// (p = m + 2 = {{P}}): with d that patch and g a 3x3 filter, the tile is
// A^T [(G g G^T) * (B^T d B)] A, where * multiplies elementwise. The p*p products per (tile,
// input channel, output channel) replace the direct method's 9*m*m, and summing them over
// input channels before the inverse transform makes the reduction p*p = {{XIS}} independent
// GEMMs (one per element xi of the transformed tile):
// M[xi][tile][k] = sum_c V[xi][tile][c] * U[xi][c][k].
//
// `prologue` transforms the filters once per call, U = G g G^T, into the workspace `ut` as
// ut[xi][c][k] (k fastest: contiguous for the main loop's loads). `main` lets each workgroup
// own {{BT}} tiles (over N * TH * TW) x {{BN}} output channels of one group. Per chunk of
// {{BC}} input channels it gathers the tiles' pxp patches (zero outside the image), transforms
// them to V in registers, and stages V and the matching U chunk in workgroup memory (the
// next chunk's loads are issued into registers before this chunk's products); each
// invocation then accumulates {{TT}} tiles x {{TK}} channels for all p*p xi, scalar
// accumulators indexed by constants (see direct.wgsl for why). The inverse transform of
// those accumulators gives each tile's outputs, stored through the fused epilogue; where one
// comes out Inf or NaN, the invocation marks itself in `marks`, and `finish` (a pass after
// `main`) sums that invocation's outputs again the direct way.
//
// Variant: {{VARIANT}}
// Shape:   {{SHAPE}}

{{ENABLES}}
// x, w, y (and z) hold {{DT}}: loads convert to f32, sums are f32, stores convert back.
alias DT = {{DT}};
@group(0) @binding(0) var<storage, read> x: array<DT>;
@group(0) @binding(1) var<storage, read> w: array<DT>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<DT>;
// One bit per invocation of `main`: set where an output came out Inf or NaN. Cleared by
// `prologue`, read by `finish`.
@group(0) @binding(5) var<storage, read_write> marks: array<atomic<u32>>;
// The transformed filters, p*p x CG x K, written by `prologue`.
@group(0) @binding(6) var<storage, read_write> ut: array<f32>;

{{EPILOGUE}}
const XSN: i32 = {{XSN}};       // x's strides: image, channel, row, column (NCHW or NHWC)
const XSC: i32 = {{XSC}};
const XSH: i32 = {{XSH}};
const XSW: i32 = {{XSW}};
const YSN: i32 = {{YSN}};       // y's strides: image, channel, pixel (oh * OW + ow)
const YSK: i32 = {{YSK}};
const YSP: i32 = {{YSP}};
const H: i32 = {{H}};
const W: i32 = {{W}};
const K: i32 = {{K}};
const OH: i32 = {{OH}};
const OW: i32 = {{OW}};
const PH: i32 = {{PH}};
const PW: i32 = {{PW}};
const CG: i32 = {{CG}};
const KG: i32 = {{KG}};
const MT: i32 = {{MT}};            // output tile side
const TW: i32 = {{TILES_W}};       // tiles per output row: ceil(OW / MT) (of a dilation phase: ceil(ceil(OW / DW) / MT))
const THW: i32 = {{TILES_HW}};     // tiles per image: ceil(OH / MT) * TW (DH * DW phases of ceil(ceil(OH / DH) / MT) * TW)
const TILES: i32 = {{TILES}};      // N * THW
const BT: i32 = {{BT}};
const BN: i32 = {{BN}};
const BC: i32 = {{BC}};
const TT: i32 = {{TT}};            // tiles per invocation
const TK: i32 = {{TK}};            // channels per invocation
const TX: i32 = {{TX}};            // invocations along the tiles (BT / TT)
const TY: i32 = {{TY}};            // invocations along the channels (BN / TK)
const WPB: u32 = {{WPB}}u;          // words of `marks` per workgroup: ceil(THREADS / 32)
const MARK_WORDS: u32 = {{MARK_WORDS}}u;
const T_BLOCKS: u32 = {{T_BLOCKS}}u;
const N_BLOCKS: u32 = {{N_BLOCKS}}u;
const BLOCKS: u32 = {{BLOCKS}}u;

// Whether v is Inf or NaN (by its bits: no compiler may assume it away).
fn nonfinite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7F800000u) == 0x7F800000u;
}

// One output as the direct method sums it, padding products included (zero times an
// infinite weight is NaN there too; `pad0` is a zero the compiler cannot see). The
// transforms subtract an infinite input from itself (Inf - Inf = NaN) and mix a NaN into
// neighbouring outputs, so where an output comes out Inf or NaN, the invocation's outputs
// are recomputed this way: the result is then the direct method's, +-Inf and NaN alike.
{{DIRECT_SUM}}
{{PAD_INDEX}}

// A workgroup's first tile, first output channel and group.
fn block_origin(block: u32) -> vec3<i32> {
    let rest = block / T_BLOCKS;
    return vec3<i32>(i32(block % T_BLOCKS) * BT, i32(rest % N_BLOCKS) * BN, i32(rest / N_BLOCKS));
}

// V as [xi][c][tile] and U as [xi][c][k], four consecutive k per vec4.
var<workgroup> v_s: array<f32, {{V_TILE}}>;
var<workgroup> u_s: array<vec4<f32>, {{U_TILE}}>;

@compute @workgroup_size({{THREADS}}, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // The grid is folded into 2D to stay under the per-dimension workgroup limit; the test
    // is uniform across the workgroup, so the barriers below stay in uniform flow.
    let block = wid.y * nwg.x + wid.x;
    if (block >= BLOCKS) {
        return;
    }
    let origin = block_origin(block);
    let t0 = origin.x;
    let n0 = origin.y;
    let g = origin.z;
    let lid = i32(lidx);
    // Zero, as a value the compiler cannot see (the dispatch is one workgroup deep in z).
    let pad0 = bitcast<f32>(nwg.z - 1u);
    let tx = lid % TX;
    let ty = lid / TX;

    // Per gather slot: which tile's patch and which channel of the chunk it transforms.
{{V_SETUP}}
    // Per load slot: which element of the U chunk it copies.
{{U_SETUP}}
{{ACC_DECL}}

    // Stage the first chunk.
    var c_next: i32 = 0;
{{FETCH}}
{{STAGE}}
    workgroupBarrier();

    for (var c0: i32 = 0; c0 < CG; c0 = c0 + BC) {
        // Issue the next chunk's global loads now; past the end they load zeros.
        c_next = c0 + BC;
{{FETCH}}
{{INNER}}
        // Everyone is done reading this chunk: overwrite it with the next.
        workgroupBarrier();
{{STAGE}}
        workgroupBarrier();
    }

    // Set where an output came out Inf or NaN.
    var bad = false;
{{STORE}}
    if (bad) {
        atomicOr(&marks[block * WPB + lidx / 32u], 1u << (lidx % 32u));
    }
}

// The invocations of `main` that marked themselves sum their outputs again the direct way;
// the others return at once. A pass of its own keeps the loop out of `main`, whose finite
// inputs never need it.
@compute @workgroup_size({{THREADS}}, 1, 1)
fn finish(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let block = wid.y * nwg.x + wid.x;
    if (block >= BLOCKS) {
        return;
    }
    if ((atomicLoad(&marks[block * WPB + lidx / 32u]) & (1u << (lidx % 32u))) == 0u) {
        return;
    }
    let origin = block_origin(block);
    let lid = i32(lidx);
    let pad0 = bitcast<f32>(nwg.z - 1u);
    redo_direct(origin.x, lid % TX, origin.y, lid / TX, origin.z, pad0);
}

// Every output invocation (tx, ty) of `main` stored, summed again the direct way.
fn redo_direct(t0: i32, tx: i32, n0: i32, ty: i32, g: i32, pad0: f32) {
    for (var q: i32 = 0; q < TT * TK * MT * MT; q = q + 1) {
        let i = q / (TK * MT * MT);
        let j = (q / (MT * MT)) % TK;
        let a = (q / MT) % MT;
        let b = q % MT;
        // The tile and channel of accumulator (i, j), as the store computes them.
        let tile = t0 + tx + i * TX;
        let n = n0 + 4 * ty + 4 * TY * (j / 4) + j % 4;
        let img = tile / THW;
        let oh = {{REDO_OH}};
        let ow = {{REDO_OW}};
        if (tile < TILES && n < KG && oh < OH && ow < OW) {
            let k = g * KG + n;
            let yi = ystore(img * YSN + k * YSK + (oh * OW + ow) * YSP);
            if (yi >= 0) {
                y[yi] = DT(epilogue(direct_sum(img, g, k, oh, ow, pad0), k, yi));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The filter transform: one (k, c) per invocation, k fastest (coalesced stores).

const R_BLOCKS: u32 = {{R_BLOCKS}}u;   // ceil(K * CG / 256)

@compute @workgroup_size(256, 1, 1)
fn prologue(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let gi = (wid.y * nwg.x + wid.x) * 256u + lidx;
    // This run's marks start clear (the workspace outlives runs).
    for (var j = gi; j < MARK_WORDS; j = j + R_BLOCKS * 256u) {
        atomicStore(&marks[j], 0u);
    }
    let i = i32(gi);
    if (i >= K * CG) {
        return;
    }
    let k = i % K;
    let c = i / K;
    let src = (k * CG + c) * 9;
    // h = G g (p x 3), then U = h G^T (p x p), G as in src/kernels/wino.rs.
{{FILTER_TRANSFORM}}
}
