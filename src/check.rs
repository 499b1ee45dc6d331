//! Output checks on the GPU (`shaders/check.wgsl`): poisoning an output before a checked run,
//! and comparing an output with a reference without reading either back.

use crate::codegen::render;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::pool::{PooledBuffer, View};

const TEMPLATE: &str = include_str!("../shaders/check.wgsl");

/// Bit pattern written into outputs before a checked run: a quiet NaN no kernel produces from
/// finite inputs, so any element a kernel fails to write stands out.
pub const POISON_BITS: u32 = 0x7FC0_BEEF;
/// The same for float16 outputs: a quiet NaN in each half of a word.
pub const POISON16_BITS: u32 = 0x7EEF_7EEF;
/// Invocations of one check dispatch; each strides over the buffer.
const WORKGROUPS: u32 = 1024;

pub struct Checker {
    fill: wgpu::ComputePipeline,
    fill16: wgpu::ComputePipeline,
    compare: wgpu::ComputePipeline,
    compare16: wgpu::ComputePipeline,
    maxabs: wgpu::ComputePipeline,
    maxabs4: wgpu::ComputePipeline,
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
                ("POISON", POISON_BITS.to_string()),
                ("POISON16", POISON16_BITS.to_string()),
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
        let (fill, compare, maxabs) = (pipeline("fill"), pipeline("compare"), pipeline("maxabs"));
        let (fill16, compare16) = (pipeline("fill16"), pipeline("compare16"));
        let maxabs4 = pipeline("maxabs4");
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Shader { variant: "check".into(), message: e.to_string() });
        }
        Ok(Checker { fill, fill16, compare, compare16, maxabs, maxabs4 })
    }

    /// Records one pass of `pipeline` over `buffers` (binding, buffer).
    fn record(
        device: &wgpu::Device,
        enc: &mut wgpu::CommandEncoder,
        pipeline: &wgpu::ComputePipeline,
        label: &str,
        buffers: &[(u32, View<'_>)],
        timestamp_writes: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) {
        let entries: Vec<_> = buffers
            .iter()
            .map(|&(binding, buf)| wgpu::BindGroupEntry { binding, resource: buf.binding() })
            .collect();
        let bg = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(WORKGROUPS, 1, 1);
    }

    /// Records filling `buf`, an output of `dtype`, with its poison pattern.
    pub fn fill(&self, device: &wgpu::Device, enc: &mut wgpu::CommandEncoder, buf: &PooledBuffer, dtype: DType) {
        let pipeline = if dtype == DType::F16 { &self.fill16 } else { &self.fill };
        Self::record(device, enc, pipeline, "convtune poison", &[(3, buf.view())], None);
    }

    /// Records writing max |x| and max |w| over finite elements into `scales` (16 bytes,
    /// zeroed here), for kernels that scale their inputs; the pass writes `timestamps`'
    /// beginning, so a timed run includes it.
    pub fn maxabs(
        &self,
        device: &wgpu::Device,
        enc: &mut wgpu::CommandEncoder,
        x: View<'_>,
        w: View<'_>,
        scales: &PooledBuffer,
        timestamps: Option<(&wgpu::QuerySet, u32)>,
    ) {
        enc.clear_buffer(scales, 0, Some(16));
        // x's vec4 view needs one whole vec4; the scalar pass takes the rare x smaller than that.
        let (pipeline, buffers) = if x.size >= 16 {
            (&self.maxabs4, vec![(0, x), (1, w), (2, scales.view()), (4, x)])
        } else {
            (&self.maxabs, vec![(0, x), (1, w), (2, scales.view())])
        };
        let timestamp_writes = timestamps.map(|(qs, i)| wgpu::ComputePassTimestampWrites {
            query_set: qs,
            beginning_of_pass_write_index: Some(i),
            end_of_pass_write_index: None,
        });
        Self::record(device, enc, pipeline, "convtune maxabs", &buffers, timestamp_writes);
    }

    /// Records comparing `got` with `want`, both of `dtype`, into `stats` (16 bytes, zeroed here).
    pub fn compare(
        &self,
        device: &wgpu::Device,
        enc: &mut wgpu::CommandEncoder,
        got: &PooledBuffer,
        want: &PooledBuffer,
        stats: &PooledBuffer,
        dtype: DType,
    ) {
        enc.clear_buffer(stats, 0, Some(16));
        let pipeline = if dtype == DType::F16 { &self.compare16 } else { &self.compare };
        Self::record(device, enc, pipeline, "convtune compare", &[(0, got.view()), (1, want.view()), (2, stats.view())], None);
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
