// convtune: transposed convolution (PyTorch's conv_transpose2d) as a gather.
//
// Output (oh, ow) receives x[ih, iw] * w[r, s] wherever oh + PH = ih * SH + r * DH and
// ow + PW = iw * SW + s * DW. So only the taps r congruent to the row's stride phase
// contribute, RSTEP apart (likewise s), and each output visits those taps alone: no
// zero-inserted copy of x, no multiply by an inserted zero. An invocation owns {{TK}}
// output channels x {{TW}} output columns of one row, columns SW apart (one column phase),
// so its columns share their taps and read neighbouring input columns. Neighbouring lanes
// take neighbouring phases: with TW = 1 they write neighbouring columns.
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
const DH: i32 = {{DH}};
const DW: i32 = {{DW}};
const RSTEP: i32 = {{RSTEP}};   // taps of one row phase lie RSTEP apart: SH / gcd(SH, DH)
const SSTEP: i32 = {{SSTEP}};   // the same across: SW / gcd(SW, DW)
const XSN: i32 = {{XSN}};       // x's strides: image, channel, row, column (NCHW or NHWC)
const XSC: i32 = {{XSC}};
const XSH: i32 = {{XSH}};
const XSW: i32 = {{XSW}};
const YSN: i32 = {{YSN}};       // y's strides: image, channel, pixel (oh * OW + ow)
const YSK: i32 = {{YSK}};
const YSP: i32 = {{YSP}};
const CG: i32 = {{CG}};         // input channels per group
const KG: i32 = {{KG}};         // output channels per group
const WSC: i32 = KG * R * S;    // w's stride between input channels: w is (C, K/groups, R, S)
const N: u32 = {{N}}u;
const QT: u32 = {{QT}}u;        // column tiles per phase
const KT: u32 = {{KT}}u;        // output-channel tiles per group
const SP_BLOCKS: u32 = {{SP_BLOCKS}}u;  // workgroups along the spatial axis
const K_BLOCKS: u32 = {{K_BLOCKS}}u;    // workgroups along the channel-tile axis

@compute @workgroup_size({{WG_X}}, {{WG_Y}}, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    // The grid is folded into 2D to stay under the per-dimension workgroup limit.
    let block = wid.y * nwg.x + wid.x;
    let sp_block = block % SP_BLOCKS;
    let rest = block / SP_BLOCKS;
    let k_block = rest % K_BLOCKS;
    let n = rest / K_BLOCKS;
    let p = sp_block * {{WG_X}}u + lid.x;
    let kt_all = k_block * {{WG_Y}}u + lid.y;
    if (n >= N || p >= u32(OH) * QT * u32(SW) || kt_all >= {{GROUPS}}u * KT) {
        return;
    }
    let oh = i32(p / (QT * u32(SW)));
    let rem = p % (QT * u32(SW));
    let q = i32(rem / u32(SW));
    let phase = i32(rem % u32(SW));
    let g = i32(kt_all / KT);
    let kk0 = i32(kt_all % KT) * {{TK}};
    let xg = i32(n) * XSN + g * CG * XSC;
    // The first tap of this row's and this column phase's stride phase; none when the
    // search runs past one period.
    let ohp = oh + PH;
    var r0: i32 = 0;
    for (; r0 < RSTEP && (ohp - r0 * DH) % SH != 0; r0 = r0 + 1) {}
    let owp = phase + PW;
    var s0: i32 = 0;
    for (; s0 < SSTEP && (owp - s0 * DW) % SW != 0; s0 = s0 + 1) {}

{{SETUP}}
    // r < RSTEP fails where no tap has the phase (r0 ran past the period).
    for (var r: i32 = r0; r < R && r0 < RSTEP; r = r + RSTEP) {
        // Exact: ohp - r * DH is a multiple of SH.
        let ih = (ohp - r * DH) / SH;
        if (ih < 0 || ih >= H) {
            continue;
        }
        for (var s: i32 = s0; s < S && s0 < SSTEP; s = s + SSTEP) {
            let iwq = (owp - s * DW) / SW + q * {{TW}};
{{TAP}}
            let xt = xg + ih * XSH;
            let wt = r * S + s;
            for (var c: i32 = 0; c < CG; c = c + 1) {
                let xc = xt + c * XSC;
                let wc = g * CG * WSC + c * WSC + wt;
{{INNER}}
            }
        }
    }

{{STORE}}
}
