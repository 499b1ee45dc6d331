//! The FMA GEMM ceiling of WGSL on this GPU, outside convtune: `python3 gen.py DIR` writes
//! GEMM kernels of several designs (tile, register tile, vec4 or scalar loads and stores,
//! staging), `cargo run --release -- DIR` times each (BENCHMARKS.md, "Vec4 loads and stores
//! in the FMA GEMMs"; `torch_ref.py` times cuBLAS on the same sizes).
//!
//! fmaprobe DIR [REPS]: times every *.wgsl GEMM in DIR. Each file's header says
//!   // gemm: M N K        C[N][M] = sum_k A[K][M] * B[N][K]   (NCHW-like 1x1 conv)
//!   // dispatch: GX GY
//! Bindings: 0 A, 1 B, 2 C (f32). Checks 256 sampled outputs against f64.
use std::time::Instant;

fn main() {
    let dir = std::env::args().nth(1).expect("dir");
    let reps: u32 = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(0);
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(desc);
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
    let adapter = adapters
        .into_iter()
        .max_by_key(|a| matches!(a.get_info().device_type, wgpu::DeviceType::DiscreteGpu) as u8)
        .expect("no adapter");
    println!("adapter: {}", adapter.get_info().name);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: None,
        required_features: adapter.features() & (wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SHADER_F16),
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .unwrap();
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "wgsl")).collect();
    files.sort();
    let mut cache: std::collections::HashMap<(u32, u32, u32), (wgpu::Buffer, wgpu::Buffer, wgpu::Buffer, Vec<f32>, Vec<f32>)> = Default::default();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        let hdr = |key: &str| -> Vec<u32> {
            let line = src.lines().find(|l| l.starts_with(&format!("// {key}:"))).expect(key);
            line.split(':').nth(1).unwrap().split_whitespace().map(|t| t.parse().unwrap()).collect()
        };
        let g = hdr("gemm");
        let (m, n, k) = (g[0], g[1], g[2]);
        let d = hdr("dispatch");
        let name = f.file_stem().unwrap().to_string_lossy().to_string();
        let entry = cache.entry((m, n, k)).or_insert_with(|| {
            let mut s = 12345u64;
            let mut rnd = |len: usize| -> Vec<f32> {
                (0..len)
                    .map(|_| {
                        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
                    })
                    .collect()
            };
            let a = rnd((m * k) as usize);
            let b = rnd((n * k) as usize);
            let mk = |data: &[f32]| {
                let buf = device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: (data.len() * 4) as u64,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                queue.write_buffer(&buf, 0, bytemuck::cast_slice(data));
                buf
            };
            let ab = mk(&a);
            let bb = mk(&b);
            let cb = mk(&vec![f32::NAN; (m * n) as usize]);
            (ab, bb, cb, a, b)
        });
        let (ab, bb, cb, a, b) = (&entry.0, &entry.1, &entry.2, &entry.3, &entry.4);
        // poison C
        queue.write_buffer(cb, 0, bytemuck::cast_slice(&vec![f32::NAN; (m * n) as usize]));
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let t0 = Instant::now();
        let module = unsafe {
            device.create_shader_module_trusted(
                wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(src.as_str().into()) },
                wgpu::ShaderRuntimeChecks::unchecked(),
            )
        };
        let pipe = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            println!("{name}: ERROR {e}");
            continue;
        }
        let compile_s = t0.elapsed().as_secs_f64();
        let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: ab.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: bb.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: cb.as_entire_binding() },
            ],
        });
        let run = |count: u32| -> f64 {
            let mut enc = device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &bg, &[]);
                for _ in 0..count {
                    pass.dispatch_workgroups(d[0], d[1], 1);
                }
            }
            let t = Instant::now();
            let idx = queue.submit([enc.finish()]);
            device.poll(wgpu::PollType::Wait { submission_index: Some(idx), timeout: None }).unwrap();
            t.elapsed().as_secs_f64()
        };
        let tp = Instant::now();
        let first = run(1);
        let t_first = tp.elapsed().as_secs_f64();
        // check
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (m * n * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(cb, 0, &staging, 0, (m * n * 4) as u64);
        queue.submit([enc.finish()]);
        staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
        let c: Vec<f32> = bytemuck::cast_slice(&staging.get_mapped_range(..).unwrap()).to_vec();
        let mut worst = 0f64;
        let mut s = 99u64;
        for t in 0..512u64 {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let (ni, mi) = if t < 4 { ((t as u32 % 2) * (n - 1), (t as u32 / 2) * (m - 1)) } else { ((s >> 33) as u32 % n, (s >> 13) as u32 % m) };
            let mut sum = 0f64;
            let mut mag = 0f64;
            for kk in 0..k {
                let p = a[(kk * m + mi) as usize] as f64 * b[(ni * k + kk) as usize] as f64;
                sum += p;
                mag += p.abs();
            }
            let got = c[(ni * m + mi) as usize] as f64;
            let e = (got - sum).abs() / mag.max(1e-30);
            worst = if e.is_nan() || got.is_nan() { f64::INFINITY } else { worst.max(e) };
        }
        let t_check = tp.elapsed().as_secs_f64();
        // how many per timed batch: about 100 ms
        let count = if reps > 0 { reps } else { ((0.1 / first.max(1e-5)) as u32).clamp(3, 2000) };
        let tw = Instant::now();
        while tw.elapsed().as_secs_f64() < 0.3 { run(count); }
        let mut best = Vec::new();
        for _ in 0..5 {
            best.push(run(count) / count as f64);
        }
        best.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let ms = best[2] * 1e3;
        let tflops = 2.0 * m as f64 * n as f64 * k as f64 / (ms * 1e-3) / 1e12;
        println!(
            "{name:40} M{m} N{n} K{k}  {ms:8.4} ms  {tflops:6.2} TFLOP/s  err {worst:.1e}  compile {compile_s:.2}s{}",
            if worst > 1e-5 { "  WRONG" } else { "" }
        );
        eprintln!("  phases: setup {:.2}s first {:.3}s check {:.2}s total {:.2}s count {count}", t0.elapsed().as_secs_f64() - tp.elapsed().as_secs_f64(), t_first, t_check, tp.elapsed().as_secs_f64());
    }
}
