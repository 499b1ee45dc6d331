//! A convolution on host data: convtune opens the best adapter itself, tunes the problem on
//! first use (the result goes to the on-disk cache shared with Python), uploads, runs and
//! reads back; the result is checked against a float64 reference.
//!
//! `cargo run --release --example host_slices`

use convtune::reference::{conv2d_f64, max_relative_error};
use convtune::{Conv2d, Engine, Layout};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::shared()?;
    println!("adapter: {}", engine.adapter_desc().name);
    // A depthwise-then-pointwise pair, channels last, with a residual on the second.
    let depthwise = Conv2d::builder([1, 24, 24, 32], [32, 1, 3, 3])
        .layout(Layout::Nhwc)
        .groups(32)
        .padding(1)
        .build()?;
    let pointwise = Conv2d::builder(depthwise.y_dims(), [32, 32, 1, 1]).layout(Layout::Nhwc).residual(0.5).build()?;

    let x: Vec<f32> = (0..depthwise.lens()[0]).map(|i| ((i * 29 % 61) as f32 - 30.0) / 15.0).collect();
    let w1: Vec<f32> = (0..depthwise.lens()[1]).map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0).collect();
    let w2: Vec<f32> = (0..pointwise.lens()[1]).map(|i| ((i * 13 % 17) as f32 - 8.0) / 40.0).collect();

    let plan1 = engine.plan(&depthwise)?;
    let plan2 = engine.plan(&pointwise)?;
    let h = engine.conv2d(&plan1, &x, &w1, None, None)?;
    let y = engine.conv2d(&plan2, &h, &w2, None, Some(&x))?;
    for (p, plan) in [(&depthwise, &plan1), (&pointwise, &plan2)] {
        println!("{}: {} ({})", p.label(), plan.variant(), plan.source());
    }

    let h_want = conv2d_f64(&depthwise, &x, &w1, None, None)?;
    let h32: Vec<f32> = h_want.iter().map(|&v| v as f32).collect();
    let y_want = conv2d_f64(&pointwise, &h32, &w2, None, Some(&x))?;
    let errs = [max_relative_error(&h, &h_want), max_relative_error(&y, &y_want)];
    println!("max relative errors against the float64 reference: {:.2e}, {:.2e}", errs[0], errs[1]);
    if errs.iter().any(|&e| e > 2e-5) {
        return Err(format!("results differ from the reference: {errs:?}").into());
    }
    println!("ok");
    Ok(())
}
