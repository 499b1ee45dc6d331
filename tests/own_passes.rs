//! convtune inside an application's command buffer: a pass of the application's own shader
//! writes x, convtune's convolution reads it and writes y, a second pass of its own shader
//! changes y; one submission, and the final buffer is checked against a float64 reference.

use convtune::reference::{conv2d_f64, max_relative_error};
use convtune::{Conv2d, Conv2dBuffers, Engine, Error, Plan};
use wgpu::util::DeviceExt;

/// The application's shader: v = v * a + b over a range of a buffer.
const AFFINE: &str = r#"
struct Params { a: f32, b: f32 }
@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&v)) {
        v[id.x] = v[id.x] * p.a + p.b;
    }
}
"#;

struct App {
    adapter: wgpu::Adapter,
    device: wgpu::Device,
    queue: wgpu::Queue,
    affine: wgpu::ComputePipeline,
}

impl App {
    fn new() -> App {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = wgpu::Backends::PRIMARY;
        let instance = wgpu::Instance::new(desc);
        let adapter = pollster::block_on(instance.request_adapter(&Default::default())).expect("an adapter (lavapipe in CI)");
        // All the adapter allows, as an application wanting the whole GPU asks for: some
        // kernel variants need more workgroup memory than wgpu's default limits.
        let desc = wgpu::DeviceDescriptor { required_limits: adapter.limits(), ..Default::default() };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).expect("a device");
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("affine"),
            source: wgpu::ShaderSource::Wgsl(AFFINE.into()),
        });
        let affine = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("affine"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        App { adapter, device, queue, affine }
    }

    fn buffer(&self, data: &[f32], usage: wgpu::BufferUsages) -> wgpu::Buffer {
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents: bytemuck::cast_slice(data), usage })
    }

    /// Records v = v * a + b over `len` floats of `buf` from byte `offset`.
    fn affine(&self, enc: &mut wgpu::CommandEncoder, buf: &wgpu::Buffer, offset: u64, len: usize, a: f32, b: f32) {
        let params = self.buffer(&[a, b], wgpu::BufferUsages::UNIFORM);
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.affine.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: buf,
                        offset,
                        size: wgpu::BufferSize::new(len as u64 * 4),
                    }),
                },
                wgpu::BindGroupEntry { binding: 1, resource: params.as_entire_binding() },
            ],
        });
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&self.affine);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups((len as u32).div_ceil(64), 1, 1);
    }

    fn read(&self, buf: &wgpu::Buffer, offset: u64, len: usize) -> Vec<f32> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: len as u64 * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, len as u64 * 4);
        self.queue.submit([enc.finish()]);
        staging.slice(..).map_async(wgpu::MapMode::Read, |r| r.expect("mapping"));
        self.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).expect("poll");
        let view = staging.slice(..).get_mapped_range().expect("mapped range");
        bytemuck::cast_slice(&view).to_vec()
    }
}

fn data(len: usize, seed: usize) -> Vec<f32> {
    (0..len).map(|i| (((i + seed) * 7919 % 211) as f32 - 105.0) / 70.0).collect()
}

/// Runs pass(x) -> conv -> pass(y) in one command buffer with x and y at offsets inside
/// larger buffers, and checks y.
fn own_passes_around(app: &App, engine: &Engine, problem: &Conv2d, plan: &Plan) {
    let [xl, wl, yl] = problem.lens().map(|n| n as usize);
    let align = app.device.limits().min_storage_buffer_offset_alignment as u64;
    let pad = vec![f32::NAN; align as usize / 4];
    let x = data(xl, 1);
    let w = data(wl, 2);
    let bias = data(problem.w_dims()[0], 3);
    let storage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    let xb = app.buffer(&[&pad[..], &x, &pad].concat(), storage);
    let wb = app.buffer(&w, storage);
    let bb = app.buffer(&bias, storage);
    let yb = app.buffer(&[&pad[..], &vec![f32::NAN; yl], &pad].concat(), storage);

    let mut enc = app.device.create_command_encoder(&Default::default());
    app.affine(&mut enc, &xb, align, xl, 2.0, -1.0);
    let buffers = Conv2dBuffers {
        x: xb.slice(align..align + xl as u64 * 4),
        w: wb.slice(..),
        bias: problem.has_bias().then(|| bb.slice(..)),
        z: None,
        y: yb.slice(align..),
    };
    let workspace = engine.encode(&mut enc, plan, &buffers).expect("encode");
    app.affine(&mut enc, &yb, align, yl, 1.0, 0.5);
    app.queue.submit([enc.finish()]);
    drop(workspace);

    let got = app.read(&yb, align, yl);
    let x2: Vec<f32> = x.iter().map(|v| v * 2.0 - 1.0).collect();
    let want: Vec<f64> = conv2d_f64(problem, &x2, &w, problem.has_bias().then_some(&bias[..]), None)
        .unwrap()
        .iter()
        .map(|v| v + 0.5)
        .collect();
    let err = max_relative_error(&got, &want);
    assert!(err <= 1e-5, "{} with {}: max relative error {err:e}", problem.label(), plan.variant());
    // The padding after y is untouched: the kernel wrote y's range only.
    assert!(app.read(&yb, align + yl as u64 * 4, pad.len()).iter().all(|v| v.is_nan()));
}

#[test]
fn convolution_between_two_passes_of_the_callers_shader() {
    let app = App::new();
    let engine = Engine::from_device(&app.adapter, &app.device, &app.queue).unwrap();
    let problem = Conv2d::builder([2, 8, 11, 13], [12, 8, 3, 3]).padding(1).bias(true).build().unwrap();
    // The plan the tuner picks, and one variant of each family with a different pass
    // structure: Winograd (a prologue pass and workspace), split-K (a finishing pass and
    // workspace), a direct kernel (one pass).
    let names = convtune::variant_names();
    let pick = |pred: &dyn Fn(&str) -> bool| names.iter().find(|n| pred(n)).cloned().expect("a variant");
    let forced = [
        pick(&|n| n.starts_with("wino_") && n.ends_with("_m4")),
        pick(&|n| n.starts_with("gemm_") && n.ends_with("_k4")),
        pick(&|n| n.starts_with("direct_")),
    ];
    own_passes_around(&app, &engine, &problem, &engine.plan(&problem).unwrap());
    for name in forced {
        let plan = engine.choose(&problem, Some(&name), &mut |_| Ok(())).unwrap();
        own_passes_around(&app, &engine, &problem, &plan);
    }
}

#[test]
fn encode_names_what_is_wrong_with_the_callers_buffers() {
    let app = App::new();
    let engine = Engine::from_device(&app.adapter, &app.device, &app.queue).unwrap();
    let problem = Conv2d::builder([1, 4, 6, 6], [4, 4, 3, 3]).bias(true).build().unwrap();
    let plan = engine.plan(&problem).unwrap();
    let storage = wgpu::BufferUsages::STORAGE;
    let big = app.buffer(&vec![0.0; 4096], storage);
    let small = app.buffer(&[0.0; 4], storage);
    let uniform = app.buffer(&vec![0.0; 4096], wgpu::BufferUsages::UNIFORM);
    let ok = Conv2dBuffers { x: big.slice(..), w: big.slice(..), bias: Some(big.slice(..)), z: None, y: small.slice(..) };
    let cases: [(Conv2dBuffers, &str); 5] = [
        (ok, "y needs 256 bytes"),
        (Conv2dBuffers { y: big.slice(4..), ..ok }, "offset 4"),
        (Conv2dBuffers { x: uniform.slice(..), ..ok }, "STORAGE"),
        (Conv2dBuffers { bias: None, ..ok }, "the problem has a bias"),
        (Conv2dBuffers { z: Some(big.slice(..)), ..ok }, "residual z given"),
    ];
    for (buffers, says) in cases {
        let mut enc = app.device.create_command_encoder(&Default::default());
        match engine.encode(&mut enc, &plan, &buffers) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains(says), "{msg:?} should say {says:?}"),
            other => panic!("expected an error saying {says:?}, got {other:?}"),
        }
    }
}

#[test]
fn an_engine_on_a_device_lacking_limits_says_which() {
    let app = App::new();
    let (device, queue) = pollster::block_on(app.adapter.request_device(&wgpu::DeviceDescriptor {
        required_limits: wgpu::Limits { max_storage_buffers_per_shader_stage: 4, ..wgpu::Limits::downlevel_defaults() },
        ..Default::default()
    }))
    .unwrap();
    match Engine::from_device(&app.adapter, &device, &queue) {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("max_storage_buffers_per_shader_stage >= 8"), "{msg}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn a_weight_tensor_rewritten_by_the_callers_pass_is_rearranged_again() {
    // A transposed convolution in its lowered form rearranges w in a weight pass, and with w
    // a Tensor that copy is kept between calls. A pass of the caller's shader writing the
    // tensor through `buffer()` must make the next call rearrange it again.
    let app = App::new();
    let engine = Engine::from_device(&app.adapter, &app.device, &app.queue).unwrap();
    let problem = Conv2d::builder([2, 6, 5, 4], [6, 4, 4, 4]).stride(2).padding(1).transposed(0).build().unwrap();
    let plan = engine.choose(&problem, Some("gemm_b32x32x8_t4x4"), &mut |_| Ok(())).unwrap();
    let [xl, wl, _] = problem.lens().map(|n| n as usize);
    let w0 = data(wl, 2);
    let xt = engine.upload(&data(xl, 1), problem.x_dims()).unwrap();
    let wt = engine.upload(&w0, problem.w_dims()).unwrap();
    // The same call with w from the host rearranges it afresh: the results must be the same.
    let check = |w: &[f32], when: &str| {
        let got: Vec<f32> = engine.conv2d_tensor::<f32>(&plan, &xt, &wt, None, None).unwrap().to_vec().unwrap();
        let want: Vec<f32> = engine.conv2d_tensor(&plan, &xt, w, None, None).unwrap().to_vec().unwrap();
        assert!(got.iter().any(|v| *v != 0.0), "{when}: all zero");
        assert_eq!(got, want, "{when}");
    };
    check(&w0, "first call");
    check(&w0, "second call, on the kept copy");
    let mut enc = app.device.create_command_encoder(&Default::default());
    app.affine(&mut enc, wt.buffer(), 0, wl, 2.0, -1.0);
    app.queue.submit([enc.finish()]);
    let w1: Vec<f32> = w0.iter().map(|v| v * 2.0 - 1.0).collect();
    check(&w1, "after the caller's pass rewrote w");
    check(&w1, "the call after that");
}
