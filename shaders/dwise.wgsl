// convtune: depthwise convolution in NHWC (one input channel per group, one output channel
// per group: the depthwise layers of MobileNet- and EfficientNet-class networks).
//
// Each invocation computes {{CV}} neighbouring channels x {{TH}} output rows x {{TW}} output
// columns. A subgroup's lanes hold neighbouring channel blocks of one pixel, so each load of
// x is a vector of {{VW}} channels and a subgroup reads whole rows of sectors; the {{CV}}
// channels' R x S weights are loaded once into registers, and each input vector feeds every
// output of the tile its taps meet. Accumulators are named vector variables, every register
// index a constant: loops over register arrays end up in local memory on NVIDIA's Vulkan
// compiler.
//
// Variant: {{VARIANT}}
// Shape:   {{SHAPE}}

{{ENABLES}}
// x, w, y (and z) hold {{DT}}: loads convert to f32, sums are f32, stores convert back.
alias DT = {{DT}};
alias XV = vec{{VW}}<DT>;
alias FV = vec{{VW}}<f32>;
@group(0) @binding(0) var<storage, read> x: array<XV>;
@group(0) @binding(1) var<storage, read> w: array<DT>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<{{Y_ELEM}}>;

{{EPILOGUE}}
{{PAD_INDEX}}
const C: i32 = {{C}};
const H: i32 = {{H}};
const W: i32 = {{W}};
const R: i32 = {{R}};
const S: i32 = {{S}};
const OH: i32 = {{OH}};
const OW: i32 = {{OW}};
const SH: i32 = {{SH}};
const SW: i32 = {{SW}};
const PH: i32 = {{PH}};
const PW: i32 = {{PW}};
const CVEC: i32 = {{CVEC}};     // vectors of {{VW}} channels per pixel (C / {{VW}})
const YSN: i32 = {{YSN}};       // y's strides: image, channel, pixel (oh * OW + ow)
const YSK: i32 = {{YSK}};
const YSP: i32 = {{YSP}};
const N: u32 = {{N}}u;
const CB: u32 = {{CB}}u;        // channel blocks of {{CV}} per pixel
const OWT: u32 = {{OWT}}u;      // output-column tiles per row
const OHT: u32 = {{OHT}}u;      // output-row tiles per image

@compute @workgroup_size({{WG}}, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    // The grid is folded into 2D to stay under the per-dimension workgroup limit.
    let id = (wid.y * nwg.x + wid.x) * {{WG}}u + lid.x;
    // Zero padding as a value the compiler cannot see: the dispatch is always one workgroup
    // deep in z. A literal 0.0 lets it fold fma(0.0, w, acc) into acc where a padding mask
    // is known at compile time, which loses the NaN that 0 * NaN (or 0 * inf) must give.
    let pad0 = FV(bitcast<f32>(nwg.z - 1u));
    // Channel blocks fastest: a subgroup's lanes read neighbouring vectors of one pixel.
    let cb = id % CB;
    let rest = id / CB;
    let owt = rest % OWT;
    let rest2 = rest / OWT;
    let oht = rest2 % OHT;
    let n = rest2 / OHT;
    if (n >= N) {
        return;
    }
    let c0 = i32(cb) * {{CV}};
    let oh0 = i32(oht) * {{TH}};
    let ow0 = i32(owt) * {{TW}};
    let ih0 = oh0 * SH - PH;
    let iw0 = ow0 * SW - PW;
    let xn = i32(n) * H;

{{WEIGHTS}}
{{MAIN}}
{{STORE}}
}
