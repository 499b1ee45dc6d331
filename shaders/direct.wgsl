// convtune: direct convolution.
//
// Each invocation computes {{TK}} output channels x {{TW}} output columns of one output row.
// Accumulators are scalar variables and every register index is a constant: loops over
// register arrays end up in local memory on NVIDIA's Vulkan compiler (30x slower).
// The problem shape is baked in as constants so index arithmetic folds at compile time.
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

{{EPILOGUE}}
{{RESUM}}
{{PAD_INDEX}}
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
const XSN: i32 = {{XSN}};       // x's strides: image, channel, row, column (NCHW or NHWC)
const XSC: i32 = {{XSC}};
const XSH: i32 = {{XSH}};
const XSW: i32 = {{XSW}};
const YSN: i32 = {{YSN}};       // y's strides: image, channel, pixel (oh * OW + ow)
const YSK: i32 = {{YSK}};
const YSP: i32 = {{YSP}};
const CG: i32 = {{CG}};         // input channels per group
const KG: i32 = {{KG}};         // output channels per group
const N: u32 = {{N}}u;
const OWT: u32 = {{OWT}}u;      // output-column tiles per row
const KT: u32 = {{KT}}u;        // output-channel tiles per group
const SP_BLOCKS: u32 = {{SP_BLOCKS}}u;  // workgroups along the spatial axis
const K_BLOCKS: u32 = {{K_BLOCKS}}u;    // workgroups along the channel-tile axis
const TK: u32 = {{TK}}u;
const WG_Y: u32 = {{WG_Y}}u;

@compute @workgroup_size({{WG_X}}, {{WG_Y}}, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    // The grid is folded into 2D to stay under the per-dimension workgroup limit.
    let block = wid.y * nwg.x + wid.x;
    // Zero padding as a value the compiler cannot see: the dispatch is always one workgroup
    // deep in z. A literal 0.0 lets it fold fma(0.0, w, acc) into acc where a padding mask
    // is known at compile time, which loses the NaN that 0 * NaN (or 0 * inf) must give.
    let pad0 = bitcast<f32>(nwg.z - 1u);
    let sp_block = block % SP_BLOCKS;
    let rest = block / SP_BLOCKS;
    let k_block = rest % K_BLOCKS;
    let n = rest / K_BLOCKS;
    let p = sp_block * {{WG_X}}u + lid.x;
    let kt_all = k_block * {{WG_Y}}u + lid.y;
    if (n >= N || p >= u32(OH) * OWT || kt_all >= {{GROUPS}}u * KT) {
        return;
    }
    let oh = i32(p / OWT);
    let ow0 = i32(p % OWT) * {{TW}};
    let g = i32(kt_all / KT);
{{CHANNELS}}
    let ih_top = oh * SH - PH;

{{SETUP}}

{{MAIN_LOOP}}

{{STORE}}
}
