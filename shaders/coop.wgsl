// convtune: implicit-GEMM convolution on cooperative matrices (tensor cores).
//
// GEMM view as in gemm.wgsl: M = N*OH*OW output pixels, {{KG}} output channels per group,
// reduction CG*R*S. Each workgroup computes a {{BM}} x {{BN}} tile with {{SUBGROUPS}} subgroups
// of 32 invocations; each subgroup holds a {{TM}} x {{TN}} grid of 16x16 f32 accumulators.
// Every {{BK}}-step, x and w are gathered from storage into registers, scaled by a power of two
// and converted to f16 while being staged in workgroup memory, then multiplied 16x16x16 at a
// time. The next step's gathers are issued before this step's products, so their latency hides
// behind them.
//
// Scaling: a pass before this kernel stores max |x| and max |w| over finite elements in
// `scales`; values are multiplied by 2^(14 - e), so the largest lands just under 2^14, far
// from f16's overflow at 65504 and 28 binades above its normal minimum. The result is
// multiplied back by the exact inverse powers of two. Inf and NaN pass through unscaled.
//
// Split {{SPLIT}}: 1 = one f16 product per term (TF32-class). 3 = each value v is also
// carried as lo = f16((v - hi) * 2^11), and hi*hi + (hi*lo + lo*hi) / 2^11 is summed with
// the correction terms in their own accumulators (float32-class, Ootomo & Yokota 2022).
//
// Layout {{LAYOUT}}: 0 gathers x in its own (N, C, H, W) layout, one element at a time, and
// stages the pixel side column-major (a_hi[k][m]) so that neighbouring invocations gather
// neighbouring pixels. 1 runs `prologue` first, which copies x to (N, H, W, C) (unless x
// is NHWC already with C/groups a multiple of four: then it is read in place) and w to
// (K, R, S, C/groups) in the workspace, each group's channels zero-padded to a multiple of
// four (CP); the reduction then walks channels fastest over KL = CP*R*S terms, so four
// consecutive terms are one 16-byte load whatever C is, and the pixel side is staged row-major
// (a_hi[m][k]). 2 is layout 1 for float16 NHWC x with C/groups a multiple of 8: x is read in
// place and w's copy packed, 8 float16 values (16 bytes, as four u32s) per gather, unpacked
// when staged. The channel side is staged as b_hi[n][k] in all. Rows are padded by 8 f16
// to spread the 16x16 loads over banks. The epilogue goes through
// a 16x16 f32 scratch per subgroup: output tiles need bounds checks, scaling and bias, and
// their pixels may cross an image boundary, which a direct matrix store cannot express.
// Where four neighbours along y's fastest axis always belong together (whole quads of
// pixels per image in NCHW, of channels per group in NHWC), each lane stores four at once.
//
// Split-K ({{SPLITS}} splits): the workgroups of one output tile each take KS terms of the
// reduction and store their partial tile, unscaled, as f32 in xt after any x copy; `finish`
// adds the parts in split order (the same sum every run) and applies the epilogue.
//
// Variant: {{VARIANT}}
// Shape:   {{SHAPE}}

enable f16;
enable wgpu_cooperative_matrix;

// x, w, y (and z) hold {{DT}}: loads convert to f32, stores convert back.
alias DT = {{DT}};
@group(0) @binding(0) var<storage, read> x: array<{{X_ELEM}}>;
@group(0) @binding(1) var<storage, read> w: array<{{W_ELEM}}>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
// y as vec4s where each store's four values are neighbours in y (see the epilogue).
@group(0) @binding(3) var<storage, read_write> y: array<{{Y_ELEM}}>;
// [0], [1]: bits of max |x| and max |w| over finite elements; [2]: 1 where the runner wrote
// them before the run (the prologue then leaves them be).
@group(0) @binding(4) var<storage, read_write> scales: array<atomic<u32>, 4>;
// Layout 1: x as (N, H, W, C) (for NCHW x) and w as (K, R, S, CG), written by `prologue`.
// The copies hold CT: f32 for float32 data (scaled when staged), f16 for float16 data.
@group(0) @binding(5) var<storage, read_write> xt: array<{{XT_ELEM}}>;
@group(0) @binding(6) var<storage, read_write> wt: array<{{WT_ELEM}}>;
alias CT = {{CT}};

// Split-K's f32 partials as binding 5 holds them: as they are, or as the bits of the u32s of
// float32 data's packed copy of x (layout 2), which they follow.
fn part4(v: vec4<f32>) -> {{XT_ELEM}} { return {{PART4}}(v); }
fn part1(v: f32) -> {{XT_SCALAR}} { return {{PART1}}(v); }
fn unpart4(v: {{XT_ELEM}}) -> vec4<f32> { return {{UNPART4}}(v); }

{{EPILOGUE}}
{{RESUM}}
{{PAD_INDEX}}
alias MatA = coop_mat16x16<f16, A>;
alias MatB = coop_mat16x16<f16, B>;
alias MatC = coop_mat16x16<f32, C>;

const CH: i32 = {{C}};       // input channels (`C` names the accumulator role)
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
const YSN: i32 = {{YSN}};       // y's strides: image, channel, pixel (oh * OW + ow)
const YSK: i32 = {{YSK}};
const YSP: i32 = {{YSP}};
const M: i32 = {{M}};              // N * OH * OW
const KR: i32 = CG * R * S;        // reduction length
const CP: i32 = {{CP}};            // CG rounded up to a multiple of 4: layout 1's channel rows
const CHP: i32 = {{CHP}};          // groups * CP: a pixel's row in layout 1's copy of x
const KRP: i32 = CP * R * S;       // layout 1's padded reduction: the padded terms are zeros
const KL: i32 = {{KL}};            // the reduction as this kernel walks it: KR, or KRP (layout 1)
const BM: i32 = {{BM}};
const BN: i32 = {{BN}};
const BK: i32 = {{BK}};
const LDA: u32 = {{LDA}}u;         // staged A: f16 elements per k row (BM + 8)
const LDB: u32 = {{LDB}}u;         // staged B: f16 elements per n row (BK + 8)
const M_BLOCKS: u32 = {{M_BLOCKS}}u;
const N_BLOCKS: u32 = {{N_BLOCKS}}u;
const BLOCKS: u32 = {{BLOCKS}}u;
const LO: f32 = 2048.0;            // 2^11: the lo part's scale
const SPLITS: u32 = {{SPLITS}}u;   // split-K: workgroups per output tile, each KS terms
const KS: i32 = {{KS}};
const YLEN: i32 = {{YLEN}};
const YLEN4: i32 = {{YLEN4}};      // YLEN rounded up to whole vec4s: one split's partials
const PART0: i32 = {{PART0}};      // the partials' first vec4 in xt (after any x copy)

{{SMEM}}
var<workgroup> scratch: array<f32, {{SCRATCH}}>;

// 2^e for the element that is largest in magnitude: values times 2^(14 - e) stay below 2^14.
fn scale_exp(bits: u32) -> i32 {
    let m = bitcast<f32>(bits);
    return clamp(14 - select(0, frexp(m).exp, m > 0.0), -126, 126);
}

@compute @workgroup_size({{THREADS}}, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // The grid is folded into 2D to stay under the per-dimension workgroup limit; the test
    // is uniform across the workgroup, so barriers and matrix operations stay in uniform flow.
    let flat = wid.y * nwg.x + wid.x;
    if (flat >= BLOCKS * SPLITS) {
        return;
    }
    let sp = i32(flat / BLOCKS);
    let k_begin = sp * KS;
    let k_end = min(k_begin + KS, KL);
    let block = flat % BLOCKS;
    let m_block = block % M_BLOCKS;
    let rest = block / M_BLOCKS;
    let n_block = rest % N_BLOCKS;
    let g = i32(rest / N_BLOCKS);
    let m0 = i32(m_block) * BM;
    let n0 = i32(n_block) * BN;
    let lid = i32(lidx);
    let sg = lidx / 32u;
    let lane = lidx % 32u;
    let wm = (sg / {{SGN}}u) * {{WM}}u;   // this subgroup's first row (pixel) in the tile
    let wn = (sg % {{SGN}}u) * {{WN}}u;   // and first column (channel)
    let x_group = g * CG * H * W;
    // float16 data is not scaled: its values are f16 already, and their products are exact.
    let ex = {{EX}};
    let ew = {{EW}};
    let sx = ldexp(1.0, ex);
    let sw = ldexp(1.0, ew);

    // This invocation's A slots: pixels decoded once, and where their terms come from.
{{A_SETUP}}
    // Its B slots: four consecutive reduction indices of one weight row each.
{{B_SETUP}}
{{ACC_DECL}}

{{FETCH}}
    // The k-steps: stage the gathered terms, issue the next step's gathers (past the end
    // they load zeros, or are skipped), multiply the staged tiles while those loads fly.
{{STEPS}}

    let ux = ldexp(1.0, -ex);
    let uw = ldexp(1.0, -ew);
    let sbase = sg * 256u;
{{STORE}}
}

// Split-K's finishing pass: four neighbouring outputs per invocation, their parts added in
// split order (the same sum every run), then the epilogue.
@compute @workgroup_size(256, 1, 1)
fn finish(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = i32((wid.y * nwg.x + wid.x) * 256u + lidx);
    if (i >= YLEN4 / 4) {
        return;
    }
    var sum = unpart4(xt[PART0 + i]);
    for (var p = 1; p < i32(SPLITS); p = p + 1) {
        sum = sum + unpart4(xt[PART0 + p * (YLEN4 / 4) + i]);
    }
{{FINISH_STORE}}
}

// ---------------------------------------------------------------------------------------
// Layout 1's prologue: the channels-last copies, and max |x|, max |w| in the same pass.
// For NCHW x, the first X_BLOCKS workgroups each transpose a 32-channel x 32-pixel tile of
// one image through workgroup memory (reads and writes both coalesced). NHWC x is read in
// place by the kernel where C/groups is a multiple of 4, so they only fold its max, striding
// over it; else they copy it with each group's channels padded, one vec4 per invocation. The
// rest rearrange w, four channels of one (k, r, s) per invocation (eight for layout 2).

const HW: i32 = H * W;
const P_TILES: u32 = {{P_TILES}}u;    // ceil(H * W / 32)
const C_TILES: u32 = {{C_TILES}}u;    // ceil(CHP / 32)
const X_BLOCKS: u32 = {{X_BLOCKS}}u;  // N * P_TILES * C_TILES (NCHW x), else vec4s / 256 (at most 1024 striding over x read in place)
const X_VEC4S: i32 = {{X_VEC4S}};    // vec4s of x (read in place: NHWC, CG a multiple of 4)
const XP_VEC4S: i32 = {{XP_VEC4S}};  // vec4s of layout 1's padded copy of x
const WV: i32 = {{WV}};               // reduction terms per element of wt: 4, or 8 packed float16 (layout 2)
const W_BLOCKS: u32 = {{W_BLOCKS}}u;  // ceil(K * KRP / WV / 256)
const KRW: i32 = KRP / WV;            // elements per wt row

var<workgroup> tile: array<f32, 1056>;  // 32 x 33: the odd row length avoids bank conflicts
var<workgroup> tile_max: array<atomic<u32>, 2>;
var<workgroup> tile_sx: f32;

// |v|'s bits when v is finite, else 0: non-negative floats order like their bits.
fn finite_abs_bits(v: f32) -> u32 {
    let b = bitcast<u32>(v) & 0x7FFFFFFFu;
    return select(0u, b, b < 0x7F800000u);
}

fn x_at(i: i32) -> f32 {
{{X_AT}}
}

fn w_at(i: i32) -> f32 {
{{W_AT}}
}

// w's element i when its channel c is a real one, else the padding's zero.
fn w_or_zero(i: i32, c: i32) -> f32 {
    return select(0.0, w_at(select(0, i, c < CG)), c < CG);
}

{{W_CHUNK}}
@compute @workgroup_size(256, 1, 1)
fn prologue(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let block = wid.y * nwg.x + wid.x;
    if (block >= X_BLOCKS + W_BLOCKS) {
        return;
    }
    if (lidx == 0u) {
        atomicStore(&tile_max[0], 0u);
        atomicStore(&tile_max[1], 0u);
        // x's scale for the packing copies, read once per workgroup.
        tile_sx = ldexp(1.0, scale_exp(atomicLoad(&scales[0])));
    }
    workgroupBarrier();
    let lid = i32(lidx);
    if (block < X_BLOCKS) {
{{PROLOGUE_X}}
    } else {
        // wt[k][(r * S + s) * CP + c] = w[k][c][r][s], WV consecutive c at a time, zero
        // for the padding channels c >= CG.
        let i = i32(block - X_BLOCKS) * 256 + lid;
        if (i < K * KRW) {
            let k = i / KRW;
            let t = WV * (i % KRW);
            let c = t % CP;
            let rs = t / CP;
            let src = (k * CG + c) * R * S + rs;
            let v = vec4<f32>(w_or_zero(src, c), w_or_zero(src + R * S, c + 1),
                              w_or_zero(src + 2 * R * S, c + 2), w_or_zero(src + 3 * R * S, c + 3));
{{WT_WRITE}}
            let b = bitcast<vec4<u32>>(v) & vec4<u32>(0x7FFFFFFFu);
            let f = select(vec4<u32>(0u), b, b < vec4<u32>(0x7F800000u));
            atomicMax(&tile_max[1], max(max(f.x, f.y), max(f.z, f.w)));
        }
    }
{{PROLOGUE_FOLD}}
}
