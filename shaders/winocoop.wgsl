// convtune: non-fused Winograd F(mxm, 3x3) convolution on cooperative matrices (tensor
// cores), m = {{MT}}: the passes of the wgemm family (shaders/winogemm.wgsl, which explains
// the method) with the transformed values in f16 and the batched GEMMs on 16x16x16
// f16 x f16 -> f32 products, as the coop family multiplies.
//
// `prologue`: its first V_BLOCKS workgroups transform the input patches, V = B^T d B, two
//   per invocation: for NCHW x two tiles (t, t + 1) of one (g, c), V stored as
//   [g][xi][c][tile]; for NHWC x two channels (c, c + 1) of one (g, tile), V stored as
//   [g][xi][tile][c] (neighbouring invocations read neighbouring values of x and write
//   neighbouring values of V in both). The last ones (F_JOBS jobs) transform the filters, U = G g G^T,
//   two input channels (c, c + 1) of one (g, n) per invocation, into U's own binding: where
//   U is kept with resident weights from an earlier call, the runner leaves them out. Each
//   pair is stored as one u32 of two f16 (U as [g][xi][n][c]: the GEMM reads 8 values per
//   16-byte load), padded with zeros to CP channels, NP output channels and TP tiles. float32 data is scaled first, as the coop family scales it: x and w times
//   powers of two that put their largest finite values just under 2^12 (then |V| and |U|
//   stay under 2^14: F(2x2)'s B^T sums 4 values with signs, G^T weighs 9 by at most 9/4),
//   and `finish` scales back; float16 data is not scaled. A value past f16's range becomes
//   Inf, which `finish` catches (the direct sum again).
// Split {{SPLIT}}: 1 = one f16 product per term ("high", float16 data); 3 = the split pair
// (U and V also stored as lo = f16((v - hi) * 2^11) after the hi parts, hi*hi + (hi*lo +
// lo*hi) / 2^11 with the correction terms in their own accumulators and their own M after
// the products', which `finish` adds: "highest", as the coop family's split).
// `main`: the {{P2}} x {{GROUPS}} batched GEMMs M = V U, {{BM}} tiles x {{BN}} channels per
//   workgroup, {{SUBGROUPS}} subgroups of {{TM}} x {{TN}} f32 accumulators, {{BK}}-deep steps
//   staged in workgroup memory (V as stored: a_hi[c][tile] or a_hi[tile][c]; U as b_hi[n][c]) with the
//   next step's loads issued before this step's products; the accumulators are stored
//   straight into M (f32, after V; [n][tile] for NCHW y, [tile][n] for NHWC), which is
//   padded to whole tiles.
// `finish` (shaders/winograd.wgsl): the inverse transform and the fused epilogue.
//
// Chunks ({{CHUNKS}}): as wgemm's.
//
// Variant: {{VARIANT}}
// Shape:   {{SHAPE}}

enable f16;
enable wgpu_cooperative_matrix;

alias DT = {{DT}};
@group(0) @binding(0) var<storage, read> x: array<DT>;
@group(0) @binding(1) var<storage, read> w: array<DT>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<DT>;
// The chunk's V (GROUPS x P2 x CP x TP, or x TP x CP; f16 packed two per u32, held as the
// bits of f32s, four per element: the GEMM's loads are 16 bytes), then from f32 MOFF on its
// M (GROUPS x P2, each NP x TP), written by `main`, read by `finish`. One binding for both:
// U takes the other.
@group(0) @binding(5) var<storage, read_write> ws: array<vec4<f32>>;
// U (GROUPS x P2 x NP x CP), packed as V: alone in its binding, where a copy kept with
// resident weights may stand in for it.
@group(0) @binding(6) var<storage, read_write> uw: array<vec4<u32>>;
const MOFF: i32 = {{MOFF}};

// M's value i, as `finish` reads it.
fn mval(i: i32) -> f32 {
    let q = MOFF + i;
    return ws[q / 4][q % 4];
}

{{EPILOGUE}}
{{WINOGRAD}}
// 2^e for the element that is largest in magnitude (`bits`): values times 2^(12 - e) stay
// below 2^12.
fn scale_exp(bits: u32) -> i32 {
    let m = bitcast<f32>(bits);
    return clamp(12 - select(0, frexp(m).exp, m > 0.0), -126, 126);
}

// Stores f16 values lo and hi (lo first) as u32 q of U (`into_u`) or V.
fn put_pair(q: i32, lo: f32, hi: f32, into_u: bool) {
    let bits = pack2x16float(vec2<f32>(lo, hi));
    if (into_u) {
        uw[q / 4][q % 4] = bits;
    } else {
        ws[q / 4][q % 4] = bitcast<f32>(bits);
    }
}

// The split pair (split 3): v's top 11 significant bits, by masking (so v - hi is exact);
// Inf and NaN whole, with a zero lo part.
fn hi_part(v: f32) -> f32 {
    let bits = bitcast<u32>(v);
    return select(v, bitcast<f32>(bits & 0xFFFFE000u), (bits & 0x7F800000u) != 0x7F800000u);
}

fn lo_part(v: f32, hi: f32) -> f32 {
    return select(0.0, (v - hi) * 2048.0, (bitcast<u32>(v) & 0x7F800000u) != 0x7F800000u);
}

// Stores a's and b's split pairs: the hi parts as u32 q, the lo parts (2^11 times the rest)
// `lo` u32s on.
fn put_split(q: i32, lo: i32, a: f32, b: f32, into_u: bool) {
    let ha = hi_part(a);
    let hb = hi_part(b);
    put_pair(q, ha, hb, into_u);
    put_pair(q + lo, lo_part(a, ha), lo_part(b, hb), into_u);
}

// ---------------------------------------------------------------------------------------
// The transforms of the filters and the input patches.

const F_JOBS: i32 = {{F_JOBS}};        // GROUPS * NP * CP / 2 filter pairs
const V_JOBS: i32 = {{V_JOBS}};        // GROUPS * CP * TP / 2 patch pairs
const V_BLOCKS: u32 = {{V_BLOCKS}}u;   // ceil(V_JOBS / 256)

@compute @workgroup_size(256, 1, 1)
fn prologue(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let block = wid.y * nwg.x + wid.x;
{{SCALES}}
    if (block >= V_BLOCKS) {
        let i = i32((block - V_BLOCKS) * 256u + lidx);
        // U stays in `uw` from the first chunk on.
        if (i >= F_JOBS || chunk_base() > 0) {
            return;
        }
        // Consecutive invocations take consecutive channel pairs (coalesced stores).
        let c0 = 2 * (i % (CP / 2));
        let c1 = c0 + 1;
        let n = (i / (CP / 2)) % NP;
        let g = i / (NP * CP / 2);
        let ok0 = n < KG && c0 < CG;
        let ok1 = n < KG && c1 < CG;
        let src0 = select(0, ((g * KG + n) * CG + c0) * 9, ok0);
        let src1 = select(0, ((g * KG + n) * CG + c1) * 9, ok1);
        let dst = ((g * P2 * NP + n) * CP + c0) / 2;   // u32s; plane xi is NP * CP / 2 on
        // h = G g (p x 3), then U = h G^T (p x p), G as in src/kernels/winogemm.rs.
{{FILTER_TRANSFORM}}
        return;
    }
    let i = i32(block * 256u + lidx);
    if (i >= V_JOBS) {
        return;
    }
{{PATCHES}}
    // d, the pxp patch (zero outside the image), then e = B^T d and V = e B, per patch.
{{INPUT_TRANSFORM}}
}

// ---------------------------------------------------------------------------------------
// The batched GEMMs.

alias MatA = coop_mat16x16<f16, A>;
alias MatB = coop_mat16x16<f16, B>;
alias MatC = coop_mat16x16<f32, C>;

const LDA: u32 = {{LDA}}u;         // staged V: f16 elements per row (BM + 8, or BK + 8 for [tile][c])
const LDB: u32 = {{LDB}}u;         // staged U: f16 elements per output-channel row (BK + 8)

// One step: V as [c][tile] (column-major A) or [tile][c] (row-major A), U as [n][c]
// (column-major B), rows padded by 8 f16 to spread the 16x16 loads over banks.
var<workgroup> a_hi: array<vec4<f16>, {{A_TILE}}>;
var<workgroup> b_hi: array<vec4<f16>, {{B_TILE}}>;
{{LO_TILES}}

@compute @workgroup_size({{THREADS}}, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    // The grid is folded into 2D to stay under the per-dimension workgroup limit; the test
    // is uniform across the workgroup, so barriers and matrix operations stay in uniform flow.
    let block = wid.y * nwg.x + wid.x;
    if (block >= BLOCKS) {
        return;
    }
    let at = gemm_block(block);
    let m0 = at.x;
    let n0 = at.y;
    let gx = at.z;                     // g * P2 + xi
    let lid = i32(lidx);
    let sg = lidx / 32u;
    let wm = (sg % {{SGM}}u) * {{WM}}u;   // this subgroup's first tile row in the workgroup's
    let wn = (sg / {{SGM}}u) * {{WN}}u;   // and first output channel
    // This GEMM's V and U ([n][c]), in 16-byte elements of `ws`.
    let a_src = {{A_SRC}};
    let b_src = (gx * NP + n0) * CP / 8;

    // Per load slot: which 8 values of a step this invocation copies.
{{SETUP}}
{{ACC_DECL}}

    var k_next: i32 = 0;
{{FETCH}}
    for (var k0: i32 = 0; k0 < CP; k0 = k0 + BK) {
        // Everyone is done reading the staged tiles of the previous step.
        workgroupBarrier();
{{STAGE}}
        workgroupBarrier();
        // The next step's loads, in flight during this step's products.
        k_next = k0 + BK;
        if (k_next < CP) {
{{FETCH}}
        }
{{INNER}}
    }

    // Straight into M: whole tiles, no bounds.
    let m_dst = u32(gx * MSX);
{{STORE}}
}
