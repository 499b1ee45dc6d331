//! What wgpu's host side costs per call on this driver: bind groups, recording and
//! submitting a one-dispatch pass, error scopes, a 16-byte write_buffer, and poll(Wait) on
//! work that finished long ago, against poll(Poll).
use std::time::{Duration, Instant};

fn med(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

pub fn host_main() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor { backends: wgpu::Backends::VULKAN, ..wgpu::InstanceDescriptor::new_without_display_handle() });
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() })).expect("adapter");
    println!("{:?}", adapter.get_info().name);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor { label: None, required_features: wgpu::Features::empty(), required_limits: adapter.limits(), ..Default::default() })).expect("device");
    let src = "@group(0) @binding(0) var<storage, read> a: array<f32>;\n@group(0) @binding(1) var<storage, read> b: array<f32>;\n@group(0) @binding(2) var<storage, read> c: array<f32>;\n@group(0) @binding(3) var<storage, read_write> y: array<f32>;\n@group(0) @binding(4) var<storage, read_write> s: array<u32>;\n@group(0) @binding(5) var<storage, read_write> t: array<f32>;\n@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) { y[g.x] = a[g.x] + b[g.x] + c[g.x] + f32(s[0]) + t[0]; }\n";
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(src.into()) });
    let pipe = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor { label: None, layout: None, module: &module, entry_point: Some("main"), compilation_options: Default::default(), cache: None });
    let bufs: Vec<wgpu::Buffer> = (0..6).map(|_| device.create_buffer(&wgpu::BufferDescriptor { label: None, size: 1 << 20, usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC, mapped_at_creation: false })).collect();
    let layout = pipe.get_bind_group_layout(0);
    let mk_bg = || device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &layout, entries: &(0..6).map(|i| wgpu::BindGroupEntry { binding: i as u32, resource: bufs[i].as_entire_binding() }).collect::<Vec<_>>() });
    let bg = mk_bg();
    let submit = |bg: &wgpu::BindGroup| {
        let mut enc = device.create_command_encoder(&Default::default());
        { let mut p = enc.begin_compute_pass(&Default::default()); p.set_pipeline(&pipe); p.set_bind_group(0, bg, &[]); p.dispatch_workgroups(4, 1, 1); }
        queue.submit(Some(enc.finish()))
    };
    let wait = |idx: Option<wgpu::SubmissionIndex>| { device.poll(wgpu::PollType::Wait { submission_index: idx, timeout: Some(Duration::from_secs(10)) }).unwrap(); };
    for _ in 0..200 { let i = submit(&bg); wait(Some(i)); }
    let n = 300;
    let time = |f: &mut dyn FnMut() -> ()| -> f64 { let mut v = Vec::new(); for _ in 0..n { let t = Instant::now(); f(); v.push(t.elapsed().as_secs_f64() * 1e6); } med(v) };
    let r = time(&mut || { let b = mk_bg(); drop(b); });
    println!("create + drop bind group (6 buffers): {r:.1} us");
    let r = time(&mut || { let i = submit(&bg); std::hint::black_box(i); });
    wait(None);
    println!("record + submit one dispatch (bind group kept): {r:.1} us");
    let r = time(&mut || { let b = mk_bg(); let i = submit(&b); std::hint::black_box(i); });
    wait(None);
    println!("bind group + record + submit: {r:.1} us");
    let r = time(&mut || { let a = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory); let b = device.push_error_scope(wgpu::ErrorFilter::Validation); let e1 = pollster::block_on(b.pop()); let e2 = pollster::block_on(a.pop()); std::hint::black_box((e1, e2)); });
    println!("two error scopes pushed and popped: {r:.1} us");
    let r = time(&mut || { queue.write_buffer(&bufs[4], 0, &[1u8; 16]); });
    wait(None);
    println!("write_buffer 16 bytes (no submit): {r:.1} us");
    let r = time(&mut || { let i = queue.submit([]); std::hint::black_box(i); });
    wait(None);
    println!("empty submit: {r:.1} us");
    // Round trip of a tiny dispatch: submit then wait.
    let r = time(&mut || { let i = submit(&bg); wait(Some(i)); });
    println!("submit + poll(Wait) on a tiny dispatch: {r:.1} us");
    // Waits on work that finished long ago.
    let mut v = Vec::new();
    let mut vp = Vec::new();
    let mut vd = Vec::new();
    for _ in 0..n {
        let i = submit(&bg);
        std::thread::sleep(Duration::from_micros(500));
        let t = Instant::now();
        device.poll(wgpu::PollType::Poll).unwrap();
        vp.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        wait(Some(i));
        v.push(t.elapsed().as_secs_f64() * 1e6);
        let i = submit(&bg);
        std::thread::sleep(Duration::from_micros(500));
        let t = Instant::now();
        wait(Some(i));
        vd.push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!("poll(Poll) after the work finished: {:.1} us; poll(Wait) after that: {:.1} us; poll(Wait) alone on finished work: {:.1} us", med(vp), med(v), med(vd));
    let r = time(&mut || { wait(None); });
    println!("poll(Wait) with nothing submitted since: {r:.1} us");
    // 20 queued dispatches, each with a fresh bind group, then one wait: per-call cost in a chain.
    let t = Instant::now();
    for _ in 0..n { let b = mk_bg(); submit(&b); }
    let per = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let t = Instant::now();
    wait(None);
    println!("chain of {n}: {per:.1} us per call queued, final wait {:.1} us", t.elapsed().as_secs_f64() * 1e6);
}
