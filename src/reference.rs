//! A float64 reference: the same problem computed on the host in the plainest way, to check
//! results against (Python: `convtune.reference.conv2d_reference`).

use crate::epilogue::Activation;
use crate::error::Result;
use crate::host::{expect_len, expect_operands};
use crate::problem::Conv2d;

/// `act(alpha1 * conv(x, w) + alpha2 * z + bias)` in float64, C-ordered in the problem's
/// layout, from float32 host data. Slow (a direct loop over every output and tap): for
/// checking small problems.
pub fn conv2d_f64(problem: &Conv2d, x: &[f32], w: &[f32], bias: Option<&[f32]>, z: Option<&[f32]>) -> Result<Vec<f64>> {
    let s = &problem.shape;
    let [xl, _, yl] = problem.lens();
    expect_len("x", x.len(), xl)?;
    expect_operands(problem, w.len(), bias, z.map(|z| Some(z.len())))?;
    let xs = s.x_strides().map(|v| v as usize);
    let ys = s.y_strides().map(|v| v as usize);
    let (oh, ow, cg, kg) = (s.oh() as i64, s.ow() as i64, s.cg() as usize, s.kg() as usize);
    let e = &s.epilogue;
    let mut y = vec![0f64; yl as usize];
    for n in 0..s.n as usize {
        for k in 0..s.k as usize {
            let g = k / kg;
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = 0f64;
                    for c in 0..cg {
                        for r in 0..s.r as i64 {
                            for t in 0..s.s as i64 {
                                let ih = i * s.stride.0 as i64 - s.pad.0 as i64 + r * s.dilation.0 as i64;
                                let iw = j * s.stride.1 as i64 - s.pad.1 as i64 + t * s.dilation.1 as i64;
                                if ih < 0 || iw < 0 || ih >= s.h as i64 || iw >= s.w as i64 {
                                    continue;
                                }
                                let xi = n * xs[0] + (g * cg + c) * xs[1] + ih as usize * xs[2] + iw as usize * xs[3];
                                let wi = ((k * cg + c) * s.r as usize + r as usize) * s.s as usize + t as usize;
                                acc += x[xi] as f64 * w[wi] as f64;
                            }
                        }
                    }
                    let yi = s.y_store_index((n * ys[0] + k * ys[1] + (i * ow + j) as usize * ys[2]) as u64) as usize;
                    let mut v = e.alpha1 as f64 * acc;
                    if let Some(z) = z {
                        v += e.alpha2 as f64 * z[yi] as f64;
                    }
                    v += bias.map_or(0.0, |b| b[k] as f64);
                    y[yi] = activate(e.activation, v);
                }
            }
        }
    }
    Ok(y)
}

fn activate(a: Activation, v: f64) -> f64 {
    if v.is_nan() {
        return v;
    }
    match a {
        Activation::None => v,
        Activation::Relu => v.max(0.0),
        Activation::LeakyRelu { negative_slope } => if v < 0.0 { v * negative_slope as f64 } else { v },
        Activation::Silu => v / (1.0 + (-v).exp()),
        Activation::Gelu => 0.5 * v * (1.0 + (0.7978845608028654 * (v + 0.044715 * v * v * v)).tanh()),
        Activation::Clamp { min, max } => v.clamp(min as f64, max as f64),
    }
}

/// The largest |got - want| over the largest finite |want| (at least 1e-30): the error
/// measure convtune's precision bounds are stated in. A NaN where the other side has none
/// counts as an infinite error; lengths that differ do too.
pub fn max_relative_error(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let scale = want.iter().filter(|v| v.is_finite()).fold(1e-30f64, |m, v| m.max(v.abs()));
    let err = |(g, w): (&f32, &f64)| match (g.is_nan(), w.is_nan()) {
        (true, true) => 0.0,
        (false, false) if *g as f64 == *w => 0.0,
        (false, false) => (*g as f64 - w).abs() / scale,
        _ => f64::INFINITY,
    };
    got.iter().zip(want).map(err).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Layout;

    /// With a pixel shuffle the reference stores each conv output where PyTorch's
    /// `pixel_shuffle` puts it, reading z there too, after the bias and before the activation.
    #[test]
    fn shuffled_reference_is_the_plain_one_moved() {
        let data = |len: usize, seed: u32| -> Vec<f32> {
            (0..len).map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0).collect()
        };
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let b = |r| {
                Conv2d::builder(layout.dims([2, 3, 5, 4]), [8, 3, 3, 3])
                    .layout(layout)
                    .padding(1)
                    .bias(true)
                    .activation(Activation::Relu)
                    .pixel_shuffle(r)
                    .build()
                    .unwrap()
            };
            let (plain, shuffled) = (b(1), b(2));
            let [xl, wl, yl] = plain.lens();
            let (x, w, bias) = (data(xl as usize, 1), data(wl as usize, 2), data(8, 3));
            let want = conv2d_f64(&plain, &x, &w, Some(&bias), None).unwrap();
            let got = conv2d_f64(&shuffled, &x, &w, Some(&bias), None).unwrap();
            for (i, v) in want.iter().enumerate() {
                assert_eq!(got[shuffled.shape.y_store_index(i as u64) as usize], *v);
            }
            // z is read at the stored index: a residual that is the stored index itself.
            let zb = Conv2d::builder(layout.dims([2, 3, 5, 4]), [8, 3, 3, 3]).layout(layout).padding(1).residual(1.0);
            let z: Vec<f32> = (0..yl).map(|i| i as f32).collect();
            let zp = zb.pixel_shuffle(2).build().unwrap();
            let zero_w = vec![0f32; wl as usize];
            let got = conv2d_f64(&zp, &x, &zero_w, None, Some(&z)).unwrap();
            assert!(got.iter().enumerate().all(|(i, v)| *v == i as f64));
        }
    }
}
