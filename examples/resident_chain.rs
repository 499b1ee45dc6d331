//! A small super-resolution tail on the GPU, frame after frame, channels last: the weights are
//! uploaded once as `Tensor`s (a kernel that reads them rearranged makes that copy on the
//! first frame and keeps it: here the pixel shuffle's permuted weight rows), each frame is
//! uploaded, runs through three convolutions without leaving the device (the second one's
//! output pixel-shuffled into twice the resolution), and is read back once; every frame is
//! checked against a float64 reference of the same chain.
//!
//! `cargo run --release --example resident_chain`

use convtune::reference::{conv2d_f64, max_relative_error};
use convtune::{Activation, Conv2d, Engine, Layout};

/// Deterministic values in about [-scale, scale].
fn data(len: usize, seed: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|i| (((i * 7919 + seed * 104_729) % 211) as f32 - 105.0) / 105.0 * scale).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::shared()?;
    println!("adapter: {}", engine.adapter_desc().name);
    let nhwc = Layout::Nhwc;
    let features = Conv2d::builder([1, 24, 32, 3], [16, 3, 3, 3]).layout(nhwc).padding(1).bias(true).activation(Activation::Relu).build()?;
    let upsample = Conv2d::builder(features.y_dims(), [64, 16, 3, 3]).layout(nhwc).padding(1).pixel_shuffle(2).build()?;
    let out = Conv2d::builder(upsample.y_dims(), [3, 16, 3, 3]).layout(nhwc).padding(1).build()?;
    let layers = [&features, &upsample, &out];
    let plans = layers.iter().map(|p| engine.plan(p)).collect::<Result<Vec<_>, _>>()?;
    for (p, plan) in layers.iter().zip(&plans) {
        println!("{}: {} ({})", p.label(), plan.variant(), plan.source());
    }
    let bias = data(16, 9, 0.1);
    let ws: Vec<Vec<f32>> = layers.iter().enumerate().map(|(i, p)| data(p.lens()[1] as usize, i, 0.3)).collect();
    let resident = layers.iter().zip(&ws).map(|(p, w)| engine.upload(w, p.w_dims())).collect::<Result<Vec<_>, _>>()?;

    for frame in 0..3 {
        let x = data(features.lens()[0] as usize, 10 + frame, 1.0);
        let t = engine.upload(&x, features.x_dims())?;
        let t = engine.conv2d_tensor::<f32>(&plans[0], &t, &resident[0], Some(&bias), None)?;
        let t = engine.conv2d_tensor::<f32>(&plans[1], &t, &resident[1], None, None)?;
        let y: Vec<f32> = engine.conv2d_tensor::<f32>(&plans[2], &t, &resident[2], None, None)?.to_vec()?;

        // The reference chain, each layer's float64 output rounded to float32 as its input.
        let mut want = conv2d_f64(&features, &x, &ws[0], Some(&bias), None)?;
        for (p, w) in [(&upsample, &ws[1]), (&out, &ws[2])] {
            let input: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            want = conv2d_f64(p, &input, w, None, None)?;
        }
        let err = max_relative_error(&y, &want);
        println!("frame {frame}: {:?} -> {:?}, max relative error {err:.2e}", features.x_dims(), out.y_dims());
        // Three float32 convolutions in a row (bound 1e-5 each).
        if err > 4e-5 {
            return Err(format!("frame {frame} differs from the reference: max relative error {err:.2e}").into());
        }
    }
    println!("ok");
    Ok(())
}
