// convtune: direct convolution over a short reduction (network stems: a few input channels).
//
// Each invocation computes {{TK}} output channels x {{TW}} neighbouring output columns of one
// row. Every invocation of a workgroup works on the same {{TK}} channels, so their weights are
// staged once in workgroup memory, four channels of one tap per vec4, and read by the whole
// subgroup at one address (a broadcast); each input value loaded feeds {{TK}} multiply-adds
// for every tap it meets. Where the reduction is short, a GEMM tile's staging and set-up cost
// more than its products, and the output's bytes set the pace: those leave as vec4 stores
// where four neighbours of y lie together.
// Accumulators are named vec4 variables, every register index a constant: loops over
// register arrays end up in local memory on NVIDIA's Vulkan compiler.
//
// Variant: {{VARIANT}}
// Shape:   {{SHAPE}}

{{ENABLES}}
// x, w, y (and z) hold {{DT}}: loads convert to f32, sums are f32, stores convert back.
alias DT = {{DT}};
@group(0) @binding(0) var<storage, read> x: array<{{X_ELEM}}>;
@group(0) @binding(1) var<storage, read> w: array<DT>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<{{Y_ELEM}}>;

{{EPILOGUE}}
{{RESUM}}
{{PAD_INDEX}}
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
const CG: i32 = {{CG}};
const TAPS: i32 = {{TAPS}};     // CG * R * S: one output's reduction
const TK: i32 = {{TK}};
const TK4: u32 = {{TK4}}u;      // vec4s of channels per tap
const WG: u32 = {{WG}}u;
const OWT: u32 = {{OWT}}u;      // output-column tiles per row
const K_BLOCKS: u32 = {{K_BLOCKS}}u;
const PIXELS: u32 = {{PIXELS}}u; // N * OH * OWT invocations' worth of tiles
const STAGED: u32 = {{STAGED}}u; // TAPS * TK4

// Tap t of channels k0 + 4q .. k0 + 4q + 3 at t * TK4 + q.
var<workgroup> wsh: array<vec4<f32>, {{STAGED}}>;

@compute @workgroup_size({{WG}}, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    // The grid is folded into 2D to stay under the per-dimension workgroup limit; the
    // channel blocks of one run of pixels are neighbours, so they share x in the caches.
    let block = wid.y * nwg.x + wid.x;
    // Zero padding as a value the compiler cannot see (the dispatch is one workgroup deep in
    // z): a literal 0.0 would let it fold fma(0.0, w, acc) into acc and lose 0 * NaN = NaN.
    let pad0 = bitcast<f32>(nwg.z - 1u);
    let k0 = i32(block % K_BLOCKS) * TK;
    let p = (block / K_BLOCKS) * WG + lid.x;

    // Channels past K stage a copy of the last one: their sums are never stored.
    for (var i = lid.x; i < STAGED; i = i + WG) {
        let t = i32(i / TK4);
        let kq = k0 + 4 * i32(i % TK4);
        wsh[i] = vec4<f32>(
            f32(w[min(kq, K - 1) * TAPS + t]),
            f32(w[min(kq + 1, K - 1) * TAPS + t]),
            f32(w[min(kq + 2, K - 1) * TAPS + t]),
            f32(w[min(kq + 3, K - 1) * TAPS + t]),
        );
    }
    workgroupBarrier();
    if (p >= PIXELS) {
        return;
    }
    let n = i32(p / (u32(OH) * OWT));
    let rest = p % (u32(OH) * OWT);
    let oh = i32(rest / OWT);
    let ow0 = i32(rest % OWT) * {{TW}};
    let xn = n * XSN;
    let ih_top = oh * SH - PH;
    let iw_left = ow0 * SW - PW;

{{SETUP}}

{{MAIN_LOOP}}

{{STORE}}
}
