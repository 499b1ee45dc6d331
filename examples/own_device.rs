//! A convolution as one more pass of an application's frame: the program opens its own
//! wgpu device, fills its own buffers, records a tuned convolution and a pass of its own
//! that reads the result into one command buffer, and checks the final buffer against a
//! float64 reference.
//!
//! `cargo run --release --example own_device`

use convtune::reference::{conv2d_f64, max_relative_error};
use convtune::{Activation, Conv2d, Conv2dBuffers, Engine};
use wgpu::util::DeviceExt;

/// The application's own pass: y = y * y, in place.
const SQUARE: &str = r#"
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&y)) {
        y[id.x] = y[id.x] * y[id.x];
    }
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::PRIMARY;
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))?;
    // Timestamps let convtune's tuner time kernels on the GPU; it works without them too.
    let features = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: features,
        // Large buffers placed as convtune's own devices place them.
        memory_hints: convtune::memory_hints(),
        ..Default::default()
    }))?;
    println!("device: {}", adapter.get_info().name);

    let engine = Engine::from_device(&adapter, &device, &queue)?;
    let problem = Conv2d::builder([2, 16, 20, 20], [32, 16, 3, 3])
        .padding(1)
        .bias(true)
        .activation(Activation::Relu)
        .build()?;
    let plan = engine.plan(&problem)?;
    println!("{}: {} ({})", problem.label(), plan.variant(), plan.source());

    let [xl, wl, yl] = problem.lens().map(|n| n as usize);
    let x: Vec<f32> = (0..xl).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    let w: Vec<f32> = (0..wl).map(|i| ((i * 53 % 97) as f32 - 48.0) / 200.0).collect();
    let bias: Vec<f32> = (0..32).map(|k| k as f32 * 0.01 - 0.1).collect();

    // x lives at an offset in a larger buffer, as tensors of an application often do.
    let align = device.limits().min_storage_buffer_offset_alignment as usize;
    let mut x_host = vec![0f32; align / 4];
    x_host.extend(&x);
    let init = |data: &[f32], usage| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(data), usage })
    };
    let storage = wgpu::BufferUsages::STORAGE;
    let xb = init(&x_host, storage);
    let wb = init(&w, storage);
    let bb = init(&bias, storage);
    let yb = init(&vec![f32::NAN; yl], storage | wgpu::BufferUsages::COPY_SRC);
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (yl * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });

    let square = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("square"),
        layout: None,
        module: &device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("square"),
            source: wgpu::ShaderSource::Wgsl(SQUARE.into()),
        }),
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let square_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &square.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry { binding: 0, resource: yb.as_entire_binding() }],
    });

    let mut encoder = device.create_command_encoder(&Default::default());
    let buffers = Conv2dBuffers {
        x: xb.slice(align as u64..),
        w: wb.slice(..),
        bias: Some(bb.slice(..)),
        z: None,
        y: yb.slice(..),
    };
    let workspace = engine.encode(&mut encoder, &plan, &buffers)?;
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&square);
        pass.set_bind_group(0, &square_group, &[]);
        pass.dispatch_workgroups((yl as u32).div_ceil(64), 1, 1);
    }
    encoder.copy_buffer_to_buffer(&yb, 0, &readback, 0, (yl * 4) as u64);
    queue.submit([encoder.finish()]);
    drop(workspace);

    readback.slice(..).map_async(wgpu::MapMode::Read, |r| r.expect("mapping the result"));
    device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None })?;
    let got: Vec<f32> = bytemuck::cast_slice(&readback.slice(..).get_mapped_range()?).to_vec();

    let want: Vec<f64> = conv2d_f64(&problem, &x, &w, Some(&bias), None)?.iter().map(|v| v * v).collect();
    let err = max_relative_error(&got, &want);
    println!("max relative error against the float64 reference: {err:.2e}");
    // Squaring doubles the relative error of the float32 convolution (bound 1e-5).
    if err > 2e-5 {
        return Err(format!("result differs from the reference: max relative error {err:.2e}").into());
    }
    println!("ok");
    Ok(())
}
