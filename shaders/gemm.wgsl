// convtune: implicit-GEMM convolution.
//
// GEMM view: M = N*OH*OW output pixels, {{KG}} output channels per group, reduction
// CG*R*S. Each workgroup computes a {{BM}} x {{BN}} tile; tiles of x and w are gathered
// straight from the tensors (no im2col buffer) into workgroup memory, {{BK}} reduction
// steps at a time, double-buffered: the next step's global loads are issued into registers
// before the current step's arithmetic, so their latency hides behind it, and one barrier
// per step suffices.
//
// Each invocation holds {{TM}} x {{TN}} accumulators as scalar variables indexed by
// constants (see direct.wgsl for why). Its rows and columns come in groups of four,
// spread so that each vec4 read of workgroup memory by a subgroup is contiguous
// (conflict-free), and the reduction loop over one staged step is written out.
//
// Split-K ({{SPLITS}} splits): the workgroups of one output tile each take KS terms of the
// reduction and write their partial tile to `ws`; `finish` adds the partials in split order
// (the same order every run, so results are reproducible) and the bias.
//
// Variant: {{VARIANT}}
// Shape:   {{SHAPE}}

{{ENABLES}}
// x, w, y (and z) hold {{DT}}, where they can, four to an element (vec4s of neighbouring
// pixels, reduction terms, outputs): loads convert to f32, sums are f32, stores convert back.
alias DT = {{DT}};
@group(0) @binding(0) var<storage, read> x: array<{{X_ELEM}}>;
@group(0) @binding(1) var<storage, read> w: array<{{W_ELEM}}>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<{{Y_ELEM}}>;
// Split-K partial outputs, SPLITS x YLEN.
@group(0) @binding(5) var<storage, read_write> ws: array<f32>;

{{EPILOGUE}}
{{RESUM}}
{{PAD_INDEX}}
const XSN: i32 = {{XSN}};       // x's strides: image, channel, row, column (NCHW or NHWC)
const XSC: i32 = {{XSC}};
const XSH: i32 = {{XSH}};
const XSW: i32 = {{XSW}};
const YSN: i32 = {{YSN}};       // y's strides: image, channel, pixel (oh * OW + ow)
const YSK: i32 = {{YSK}};
const YSP: i32 = {{YSP}};
const C: i32 = {{C}};
const H: i32 = {{H}};
const W: i32 = {{W}};
const K: i32 = {{K}};
const R: i32 = {{R}};
const S: i32 = {{S}};
const OH: i32 = {{OH}};
const OW: i32 = {{OW}};
const SH: i32 = {{SH}};
const SW: i32 = {{SW}};
const PH: i32 = {{PH}};
const PW: i32 = {{PW}};
const DH: i32 = {{DH}};
const DW: i32 = {{DW}};
const CG: i32 = {{CG}};
const KG: i32 = {{KG}};
const OHW: i32 = OH * OW;
const M: i32 = {{M}};              // N * OH * OW
const KR: i32 = CG * R * S;        // reduction length
const BM: i32 = {{BM}};
const BN: i32 = {{BN}};
const BK: i32 = {{BK}};
const TX: i32 = {{TX}};            // invocations along M (BM / TM)
const TY: i32 = {{TY}};            // invocations along N (BN / TN)
// A staged A row: BM / 4 vec4s, and on 1x1 NHWC problems one of padding, so invocations
// staging neighbouring reduction terms of one pixel write to different banks.
const A_ROW: i32 = {{A_ROW}};
const A_STAGE: i32 = BK * A_ROW;   // vec4s in one staged A tile
const B_STAGE: i32 = BK * BN / 4;
const M_BLOCKS: u32 = {{M_BLOCKS}}u;
const N_BLOCKS: u32 = {{N_BLOCKS}}u;
const BLOCKS: u32 = {{BLOCKS}}u;       // output tiles
const SPLITS: u32 = {{SPLITS}}u;
const KS: i32 = {{KS}};                // reduction terms per split, whole steps
const YLEN: i32 = {{YLEN}};

// Two stages each: [k][m] and [k][n], four consecutive m (or n) per vec4.
var<workgroup> a_tile: array<vec4<f32>, {{A_TILE}}>;
var<workgroup> b_tile: array<vec4<f32>, {{B_TILE}}>;

@compute @workgroup_size({{THREADS}}, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // The grid is folded into 2D to stay under the per-dimension workgroup limit; the
    // test is uniform across the workgroup, so the barriers below stay in uniform flow.
    let block = wid.y * nwg.x + wid.x;
    // Zero padding as a value the compiler cannot see: the dispatch is always one workgroup
    // deep in z. A literal 0.0 lets it fold fma(0.0, w, acc) into acc where a padding mask
    // is known at compile time, which loses the NaN that 0 * NaN (or 0 * inf) must give.
    let pad0 = bitcast<f32>(nwg.z - 1u);
    if (block >= BLOCKS * SPLITS) {
        return;
    }
    let sp = i32(block / BLOCKS);
    let k_begin = sp * KS;
    let k_end = min(KR, k_begin + KS);
    let m_block = (block % BLOCKS) % M_BLOCKS;
    let rest = (block % BLOCKS) / M_BLOCKS;
    let n_block = rest % N_BLOCKS;
    let g = i32(rest / N_BLOCKS);
    let m0 = i32(m_block) * BM;
    let n0 = i32(n_block) * BN;
    let lid = i32(lidx);
{{LANES}}
    let x_group = g * CG * XSC;

    // Per load slot: which pixel this invocation gathers for the A tile, decoded once.
{{A_SETUP}}
    // Per load slot: which weight row this invocation gathers for the B tile.
{{B_SETUP}}

{{ACC_DECL}}

    // Stage the first reduction step.
    var stage: i32 = 0;
    var k_next: i32 = k_begin;
{{FETCH}}
{{STAGE_STORE}}
    workgroupBarrier();

    for (var k0: i32 = k_begin; k0 < k_end; k0 = k0 + BK) {
        // Issue the next step's global loads now; past the end they load zeros.
        k_next = k0 + BK;
{{ADVANCE}}
{{FETCH}}
        let a_base = stage * A_STAGE;
        let b_base = stage * B_STAGE;
{{INNER}}
        // The other stage was last read before the previous barrier: safe to overwrite.
        stage = 1 - stage;
{{STAGE_STORE}}
        workgroupBarrier();
    }

{{STORE}}
}

@compute @workgroup_size(256, 1, 1)
fn finish(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = i32((wid.y * nwg.x + wid.x) * 256u + lidx);
    if (i >= YLEN) {
        return;
    }
    var sum = ws[i];
    for (var p = 1; p < i32(SPLITS); p = p + 1) {
        sum = sum + ws[p * YLEN + i];
    }
    // A lowered transposed convolution's outputs past y's edges have nowhere to go.
    let yi = ystore(i);
    if (yi >= 0) {
        {{Y_AT}} = DT(epilogue({{FINISHED}}, (i / YSK) % K, yi));
    }
}
