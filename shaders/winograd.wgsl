// convtune: what the non-fused Winograd families share (`wgemm` on FMA units, `wcoop` on
// tensor cores): the shape's constants, the tiles' geometry, and `finish`, the inverse
// transform A^T M A of one (g, n, tile) per invocation with the fused epilogue in its store.
// Where an output comes out Inf or NaN (the transforms subtract an infinite input from
// itself and mix a NaN into neighbouring outputs; a transform may overflow where the direct
// sum does not), the invocation sums its outputs again the direct way, so the result is the
// direct method's, +-Inf and NaN alike. M is f32; each family's `mval(i)` reads it.

const XSN: i32 = {{XSN}};       // x's strides: image, channel, row, column (NCHW or NHWC)
const XSC: i32 = {{XSC}};
const XSH: i32 = {{XSH}};
const XSW: i32 = {{XSW}};
const YSN: i32 = {{YSN}};       // y's strides: image, channel, pixel (oh * OW + ow)
const YSK: i32 = {{YSK}};
const YSP: i32 = {{YSP}};
const H: i32 = {{H}};
const W: i32 = {{W}};
const OH: i32 = {{OH}};
const OW: i32 = {{OW}};
const PH: i32 = {{PH}};
const PW: i32 = {{PW}};
const CG: i32 = {{CG}};
const KG: i32 = {{KG}};
const MT: i32 = {{MT}};            // output tile side
const P2: i32 = {{P2}};            // elements of a transformed tile
const TW: i32 = {{TILES_W}};       // tiles per output row: ceil(OW / MT) (of a dilation phase: ceil(ceil(OW / DW) / MT))
const THW: i32 = {{TILES_HW}};     // tiles per image: ceil(OH / MT) * TW (DH * DW phases of ceil(ceil(OH / DH) / MT) * TW)
const TILES: i32 = {{TILES}};      // N * THW
const CP: i32 = {{CP}};            // CG padded to whole steps of BK
const NP: i32 = {{NP}};            // KG padded to whole tiles of BN
const TP: i32 = {{TP}};            // a chunk's tiles (all TILES in one chunk), whole tiles of BM
const CT: i32 = {{CT}};            // tiles `finish` decodes per chunk (TILES in one chunk, else TP)
const VOFF: i32 = {{VOFF}};        // where V starts in `ws`
const MSX: i32 = NP * TP;          // M's strides: (g, xi), channel, tile
const MSN: i32 = {{MSN}};
const MST: i32 = {{MST}};

// The first tile of the chunk the passes compute.
{{CHUNK}}
// Whether v is Inf or NaN (by its bits: no compiler may assume it away).
fn nonfinite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7F800000u) == 0x7F800000u;
}

// The batched GEMMs' workgroup tiles: BM tiles x BN output channels, BK-deep steps.
const BM: i32 = {{BM}};
const BN: i32 = {{BN}};
const BK: i32 = {{BK}};
const M_BLOCKS: u32 = {{M_BLOCKS}}u;   // TP / BM
const N_BLOCKS: u32 = {{N_BLOCKS}}u;   // NP / BN
const BLOCKS: u32 = {{BLOCKS}}u;       // M_BLOCKS * N_BLOCKS * GROUPS * P2

// GEMM workgroup `block`'s first tile, first output channel, and its GEMM g * P2 + xi.
fn gemm_block(block: u32) -> vec3<i32> {
    let rest = block / M_BLOCKS;
    return vec3<i32>(i32(block % M_BLOCKS) * BM, i32(rest % N_BLOCKS) * BN, i32(rest / N_BLOCKS));
}

// The first output row and column of tile t (< TILES) and its image.
{{TILE_ORIGIN}}

// ---------------------------------------------------------------------------------------
// The inverse transform and the epilogue.

const O_JOBS: i32 = {{O_JOBS}};        // GROUPS * KG * CT

// One output as the direct method sums it, padding products included (zero times an
// infinite weight is NaN there too; `pad0` is a zero the compiler cannot see).
{{DIRECT_SUM}}
{{PAD_INDEX}}

@compute @workgroup_size(256, 1, 1)
fn finish(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = i32((wid.y * nwg.x + wid.x) * 256u + lidx);
    if (i >= O_JOBS) {
        return;
    }
    // Zero, as a value the compiler cannot see (the dispatch is one workgroup deep in z).
    let pad0 = bitcast<f32>(nwg.z - 1u);
{{O_DECODE}}
    // The last chunk's padding tiles have no outputs.
    let tg = chunk_base() + t;
    if (tg >= TILES) {
        return;
    }
    let k = g * KG + n;
    let o = tile_origin(tg);
    let src = g * P2 * MSX + n * MSN + t * MST;
    let yb = o.x * YSN + k * YSK + (o.y * OW + o.z) * YSP;
    var bad = false;
    // M's p x p values, then A^T M and (A^T M) A, each output where it exists.
{{OUTPUT_TRANSFORM}}
    if (bad) {
        for (var q: i32 = 0; q < MT * MT; q = q + 1) {
            let oh = o.y + q / MT{{DIL_ROWS}};
            let ow = o.z + q % MT{{DIL_COLS}};
            if (oh < OH && ow < OW) {
                let yi = ystore(o.x * YSN + k * YSK + (oh * OW + ow) * YSP);
                if (yi >= 0) {
                    y[yi] = DT(epilogue(direct_sum(o.x, g, k, oh, ow, pad0), k, yi));
                }
            }
        }
    }
}
