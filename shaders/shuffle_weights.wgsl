// convtune {{VARIANT}}'s weights for {{SHAPE}}: the pixel shuffle's conv with its output
// channels reordered within each group from (c, phase) to (phase, c), so that a phase's
// channels are side by side in the store. Lowered row g * KG + phase * KGF + c is w's row
// g * KG + c * P + phase.
{{ENABLES}}
@group(0) @binding(1) var<storage, read> w: array<{{DT}}>;
@group(0) @binding(3) var<storage, read_write> lowered: array<{{DT}}>;

const LEN: i32 = {{LEN}};
const ROW: i32 = {{ROW}};
const KG: i32 = {{KG}};
const KGF: i32 = {{KGF}};
const P: i32 = {{PHASES_Q}};

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
    let kl = e / ROW;
    let g = kl / KG;
    let phase = (kl % KG) / KGF;
    let c = kl % KGF;
    lowered[e] = w[(g * KG + c * P + phase) * ROW + e % ROW];
}
