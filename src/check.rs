//! Output checks on the GPU (`shaders/check.wgsl`): poisoning an output before a checked run,
//! and comparing an output with a reference without reading either back.

use crate::codegen::render;
use crate::device::Engine;
use crate::error::{Error, Result};
use crate::pool::PooledBuffer;

const TEMPLATE: &str = include_str!("../shaders/check.wgsl");
/// Invocations of one check dispatch; each strides over the buffer.
const WORKGROUPS: u32 = 1024;

pub struct Checker {
    fill: wgpu::ComputePipeline,
    compare: wgpu::ComputePipeline,
}

/// What `compare` found: enough for the same verdict as the host-side check.
#[derive(Clone, Copy, Debug)]
pub struct Comparison {
    /// Largest |got - want| over elements where both are finite.
    pub max_diff: f32,
    /// Largest finite |want|.
    pub max_want: f32,
    /// Elements that are not finite where the reference holds something else.
    pub bad: u32,
}

impl Comparison {
    pub fn relative_error(&self) -> f64 {
        self.max_diff as f64 / (self.max_want as f64).max(f32::MIN_POSITIVE as f64)
    }
}

impl Checker {
    pub fn new(device: &wgpu::Device) -> Result<Checker> {
        let source = render(
            TEMPLATE,
            &[
                ("POISON", crate::runner::POISON_BITS.to_string()),
                ("THREADS", (WORKGROUPS * 256).to_string()),
            ],
        )?;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("convtune check"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = |entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("convtune check"),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        let (fill, compare) = (pipeline("fill"), pipeline("compare"));
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Shader { variant: "check".into(), message: e.to_string() });
        }
        Ok(Checker { fill, compare })
    }

    /// Records filling `buf` with the poison pattern.
    pub fn fill(&self, engine: &Engine, enc: &mut wgpu::CommandEncoder, buf: &PooledBuffer) {
        let bg = engine.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("convtune poison"),
            layout: &self.fill.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry { binding: 3, resource: buf.binding() }],
        });
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&self.fill);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(WORKGROUPS, 1, 1);
    }

    /// Records comparing `got` with `want` into `stats` (16 bytes, zeroed here).
    pub fn compare(
        &self,
        engine: &Engine,
        enc: &mut wgpu::CommandEncoder,
        got: &PooledBuffer,
        want: &PooledBuffer,
        stats: &PooledBuffer,
    ) {
        enc.clear_buffer(stats, 0, Some(16));
        let bg = engine.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("convtune compare"),
            layout: &self.compare.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: got.binding() },
                wgpu::BindGroupEntry { binding: 1, resource: want.binding() },
                wgpu::BindGroupEntry { binding: 2, resource: stats.binding() },
            ],
        });
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&self.compare);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(WORKGROUPS, 1, 1);
    }
}

impl Comparison {
    pub fn from_stats(raw: &[u8; 16]) -> Comparison {
        let word = |i: usize| u32::from_le_bytes(raw[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        Comparison {
            max_diff: f32::from_bits(word(0)),
            max_want: f32::from_bits(word(1)),
            bad: word(2),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::device::engine;
    use crate::params::{ConvShape, Padding};
    use crate::runner::{random_data, DeviceTensors};
    use crate::variants::Variant;

    #[test]
    fn gpu_comparison_sees_right_wrong_and_unwritten_outputs() {
        let e = engine().expect("a Vulkan adapter (lavapipe in CI)");
        let s = ConvShape::new([2, 5, 9, 8], [6, 5, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
            .unwrap();
        let t = DeviceTensors::upload(&e, &s, &random_data(s.x_len() as usize, 1), &random_data(s.w_len() as usize, 2), None)
            .unwrap();
        let looped: Variant = "direct_wg64x1_u0_k1w1".parse().unwrap();
        let gemm: Variant = "gemm_b32x32x8_t4x4".parse().unwrap();
        t.poison(&e).unwrap();
        t.run(&e, &e.compile(&looped, &s).unwrap()).unwrap();
        let reference = t.copy_y(&e).unwrap();

        t.poison(&e).unwrap();
        t.run(&e, &e.compile(&gemm, &s).unwrap()).unwrap();
        let c = t.compare_y(&e, &reference).unwrap();
        assert_eq!(c.bad, 0);
        assert!(c.max_want > 0.0 && c.relative_error() < 1e-5, "{c:?}");

        // Finite but wrong: the same kernel on other inputs.
        let other = DeviceTensors::upload(&e, &s, &random_data(s.x_len() as usize, 3), &random_data(s.w_len() as usize, 2), None)
            .unwrap();
        other.run(&e, &e.compile(&looped, &s).unwrap()).unwrap();
        let c = other.compare_y(&e, &reference).unwrap();
        assert!(c.bad == 0 && c.relative_error() > 0.1, "{c:?}");

        // Poisoned and never written: every element is NaN where the reference is finite.
        t.poison(&e).unwrap();
        let c = t.compare_y(&e, &reference).unwrap();
        assert_eq!(c.bad as u64, s.y_len());
    }
}
