fn direct_sum(img: i32, g: i32, k: i32, oh: i32, ow: i32, pad0: f32) -> f32 {
    var acc = 0.0;
    for (var c: i32 = 0; c < CG; c = c + 1) {
        let xc = img * XSN + (g * CG + c) * XSC;
        let wc = (k * CG + c) * KSIDE * KSIDE;
        for (var r: i32 = 0; r < KSIDE; r = r + 1) {
            for (var q: i32 = 0; q < KSIDE; q = q + 1) {
                let ih = oh - PH + r;
                let iw = ow - PW + q;
                let ok = ih >= 0 && ih < H && iw >= 0 && iw < W;
                let xv = select(pad0, f32(x[select(0, xc + ih * XSH + iw * XSW, ok)]), ok);
                acc = acc + xv * f32(w[wc + r * KSIDE + q]);
            }
        }
    }
    return acc;
}
