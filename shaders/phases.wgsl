// convtune {{VARIANT}}'s weights for the transposed convolution {{SHAPE}}, lowered to a
// stride-1 convolution with {{PHASES}} output phases stacked as channels. Lowered weight
// (k', c, a, b), with k' = g * P * KG + n and n = phase * KG + kk (channels-last) or
// kk * P + phase (channels-first; see Scatter in src/params.rs), is the transposed weight
// (g * CG + c, kk, i + (A - 1 - a) * SH, j + (B - 1 - b) * SW) for the phase's row and
// column residues i = phase / SW and j = phase % SW, or zero past the kernel's edge. A kernel
// dilated at a stride past 1 is spread out to RE x SE taps, its weights DH and DW apart and
// zeros between. With a
// pixel shuffle by Q after it, n counts PQ = P * Q * Q finer phases of KGF = KG / (Q * Q)
// channels each.
{{ENABLES}}
@group(0) @binding(1) var<storage, read> w: array<{{DT}}>;
@group(0) @binding(3) var<storage, read_write> lowered: array<{{DT}}>;

const LEN: i32 = {{LEN}};
const P: i32 = {{PHASES}};
const PQ: i32 = {{PHASES_Q}};
const KGF: i32 = {{KGF}};
const Q: i32 = {{Q}};
const KG: i32 = {{KG}};
const CG: i32 = {{CG}};
const A: i32 = {{A}};
const B: i32 = {{B}};
const R: i32 = {{R}};
const S: i32 = {{S}};
const SH: i32 = {{SH}};
const SW: i32 = {{SW}};
const RE: i32 = {{RE}};
const SE: i32 = {{SE}};
const DH: i32 = {{DH}};
const DW: i32 = {{DW}};

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let e = i32((wid.y * nwg.x + wid.x) * 256u + lidx);
    if (e >= LEN) {
        return;
    }
    let b = e % B;
    let a = (e / B) % A;
    let c = (e / (A * B)) % CG;
    let kl = e / (A * B * CG);
    let g = kl / (P * KG);
    let n = kl % (P * KG);
    // A pixel shuffle after the transposed convolution (Q > 1) splits each phase's row and
    // column residues into the transposed phase and the shuffle's sub-pixel.
    let phase = {{PHASE_OF_N}};
    let cf = {{CF_OF_N}};
    let ph_h = phase / (SW * Q);
    let ph_w = phase % (SW * Q);
    let kk = (cf * Q + ph_h % Q) * Q + ph_w % Q;
    let r = ph_h / Q + (A - 1 - a) * SH;
    let s = ph_w / Q + (B - 1 - b) * SW;
    var v = {{DT}}(0.0);
    if (r < RE && s < SE && r % DH == 0 && s % DW == 0) {
        v = w[(((g * CG + c) * KG + kk) * R + r / DH) * S + s / DW];
    }
    lowered[e] = v;
}
