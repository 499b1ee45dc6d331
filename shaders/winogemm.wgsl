// convtune: non-fused Winograd F(mxm, rxr) convolution, m = {{MT}}, r = {{R}} (stride 1; a dilated
// problem as its dilation's phases), in three passes over workspace, as ncnn's Vulkan
// winograd shaders do.
//
// Each mxm block of outputs ("tile") of one image comes from the pxp input patch above it
// (p = m + r - 1 = {{P}}): with d that patch and g an rxr filter, the tile is
// A^T [(G g G^T) * (B^T d B)] A, where * multiplies elementwise. Summing the products over
// a group's input channels before the inverse transform makes the reduction p*p = {{P2}}
// independent GEMMs, one per element xi of the transformed tile and group g:
// M[g][xi][tile][n] = sum_c V[g][xi][c][tile] * U[g][xi][c][n].
//
// `prologue`: its first V_BLOCKS workgroups transform the input patches, V = B^T d B, one
//   (g, c, tile) per invocation (zero outside the image); the last ones (F_JOBS jobs) the filters,
//   U = G g G^T, one (g, c, n) per invocation. Both are padded with zeros to CP channels, NP
//   output channels and TP tiles (whole GEMM tiles and steps: the GEMM needs no bounds). Where
//   U has a binding of its own (V and M then share `ws`), a weight Tensor keeps it and the
//   runner leaves the filter workgroups out.
// `main`: the {{P2}} x {{GROUPS}} batched GEMMs, {{BM}} tiles x {{BN}} channels per workgroup,
//   {{BK}}-deep steps double-buffered in workgroup memory, {{TM}} x {{TN}} scalar accumulators
//   per invocation (the gemm family's written-out inner loop), into `mw`.
// `finish` (shaders/winograd.wgsl, shared with the tensor-core family `wcoop`): the inverse
//   transform A^T M A of one (g, n, tile) per invocation and the fused epilogue in its store.
//
// Chunks ({{CHUNKS}}): where V and M of every tile would pass the workspace bound, the three
// passes run once per chunk of TP consecutive tiles (tile = chunk_base() + the pass's own
// tile), reusing the workspace; U is transformed by the first chunk's prologue only.
//
// Variant: {{VARIANT}}
// Shape:   {{SHAPE}}

{{ENABLES}}
// x, w, y (and z) hold {{DT}}: loads convert to f32, the workspaces and sums are f32, stores
// convert back.
alias DT = {{DT}};
@group(0) @binding(0) var<storage, read> x: array<DT>;
@group(0) @binding(1) var<storage, read> w: array<DT>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<DT>;
{{WORKSPACES}}

{{EPILOGUE}}
{{WINOGRAD}}
// ---------------------------------------------------------------------------------------
// The transforms of the filters and the input patches.

const F_JOBS: i32 = {{F_JOBS}};        // GROUPS * CP * NP filters
const V_JOBS: i32 = {{V_JOBS}};        // GROUPS * CP * TP patches
const V_BLOCKS: u32 = {{V_BLOCKS}}u;   // ceil(V_JOBS / 256)

@compute @workgroup_size(256, 1, 1)
fn prologue(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let block = wid.y * nwg.x + wid.x;
    if (block >= V_BLOCKS) {
        let i = i32((block - V_BLOCKS) * 256u + lidx);
        // U stays in its workspace from the first chunk on.
        if (i >= F_JOBS || chunk_base() > 0) {
            return;
        }
        // Consecutive invocations take consecutive output channels (coalesced stores).
        let n = i % NP;
        let c = (i / NP) % CP;
        let g = i / (NP * CP);
        let ok = n < KG && c < CG;
        let src = select(0, ((g * KG + n) * CG + c) * {{R}} * {{S}}, ok);
        let dst = (g * P2 * CP + c) * NP + n;
        // h = G g (p x r), then U = h G^T (p x p), G as in src/kernels/winogemm.rs.
{{FILTER_TRANSFORM}}
        return;
    }
    let i = i32(block * 256u + lidx);
    if (i >= V_JOBS) {
        return;
    }
    // Consecutive invocations take consecutive tiles of one channel (coalesced stores).
    let t = i % TP;
    let c = (i / TP) % CP;
    let g = i / (TP * CP);
    let tg = chunk_base() + t;
    let tok = tg < TILES && c < CG;
    let o = tile_origin(min(tg, TILES - 1));
    let ih = o.y - PH;
    let iw = o.z - PW;
    let xb = o.x * XSN + (g * CG + min(c, CG - 1)) * XSC + ih * XSH + iw * XSW;
    let dst = VOFF + (g * P2 * CP + c) * TP + t;
    // d, the pxp patch (zero outside the image), then e = B^T d and V = e B.
{{INPUT_TRANSFORM}}
}

// ---------------------------------------------------------------------------------------
// The batched GEMMs.

const TX: i32 = {{TX}};            // invocations along the tiles (BM / TM)
const TY: i32 = {{TY}};            // invocations along the channels (BN / TN)
const A_ROW: i32 = {{A_ROW}};      // vec4s in one staged row of V (BM / 4)
const A_STAGE: i32 = BK * A_ROW;
const B_STAGE: i32 = BK * BN / 4;

// Two stages each: V as [c][tile] and U as [c][n], four consecutive tiles (channels) per vec4.
var<workgroup> a_tile: array<vec4<f32>, {{A_TILE}}>;
var<workgroup> b_tile: array<vec4<f32>, {{B_TILE}}>;

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
    let at = gemm_block(block);
    let m0 = at.x;
    let n0 = at.y;
    let gx = at.z;                     // g * P2 + xi
    let lid = i32(lidx);
{{LANES}}
    // This GEMM's V ([c][tile]) and U ([c][n]).
    let a_src = VOFF + gx * CP * TP + m0;
    let b_src = gx * CP * NP + n0;

    // Per load slot: which vec4 of a staged step this invocation copies.
{{SETUP}}
{{ACC_DECL}}

    // Stage the first step.
    var stage: i32 = 0;
    var k_next: i32 = 0;
{{FETCH}}
{{STAGE_STORE}}
    workgroupBarrier();

    for (var k0: i32 = 0; k0 < CP; k0 = k0 + BK) {
        // Issue the next step's loads now; after the last step they load it again, unused.
        k_next = min(k0 + BK, CP - BK);
{{FETCH}}
        let a_base = stage * A_STAGE;
        let b_base = stage * B_STAGE;
{{INNER}}
        // The other stage was last read before the previous barrier: safe to overwrite.
        stage = 1 - stage;
{{STAGE_STORE}}
        workgroupBarrier();
    }

    // Register (i, j) holds tile m0 + 4*TX*(i/4) + 4*tx + i%4 and channel likewise.
    let m_dst = gx * MSX;
{{STORE}}
}
