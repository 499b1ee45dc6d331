//! Running a compiled kernel: device buffers, dispatch, read-back and GPU timing.

use crate::device::{Compiled, Engine};
use crate::error::{Error, Result};
use crate::params::ConvShape;
use crate::variants::Variant;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long one wait for the GPU may take before the call gives up with an error.
const GPU_WAIT: Duration = Duration::from_secs(600);

/// Bit pattern written into outputs before a checked run: a quiet NaN no kernel produces from
/// finite inputs, so any element a kernel fails to write stands out.
pub const POISON_BITS: u32 = 0x7FC0_BEEF;

fn bytes(data: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

/// The four tensors of one conv2d problem, resident on the GPU.
pub struct DeviceTensors {
    pub shape: ConvShape,
    x: wgpu::Buffer,
    w: wgpu::Buffer,
    bias: Option<wgpu::Buffer>,
    y: wgpu::Buffer,
}

fn check_binding(engine: &Engine, what: &str, elems: u64) -> Result<u64> {
    let size = elems * 4;
    let max = engine.limits.max_storage_buffer_binding_size.min(engine.limits.max_buffer_size);
    if size > max {
        return Err(Error::invalid(format!(
            "{what} needs {size} bytes, more than the adapter's largest storage buffer ({max} bytes)"
        )));
    }
    Ok(size)
}

/// Runs `f` inside out-of-memory and validation error scopes and turns what they caught into
/// an error. Scopes are per thread, so concurrent calls do not see each other's errors.
fn scoped<T>(engine: &Engine, f: impl FnOnce() -> T) -> Result<T> {
    let oom = engine.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let val = engine.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let out = f();
    let val_err = pollster::block_on(val.pop());
    let oom_err = pollster::block_on(oom.pop());
    if let Some(e) = oom_err {
        return Err(Error::OutOfMemory(e.to_string()));
    }
    if let Some(e) = val_err {
        return Err(Error::from(e));
    }
    Ok(out)
}

impl DeviceTensors {
    pub fn upload(
        engine: &Engine,
        shape: &ConvShape,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
    ) -> Result<Self> {
        let xs = check_binding(engine, "x", shape.x_len())?;
        let ws = check_binding(engine, "w", shape.w_len())?;
        let ys = check_binding(engine, "the output", shape.y_len())?;
        debug_assert_eq!(x.len() as u64 * 4, xs);
        debug_assert_eq!(w.len() as u64 * 4, ws);
        let dev = &engine.device;
        let input = |label: &str, size: u64| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let t = scoped(engine, || {
            let t = DeviceTensors {
                shape: *shape,
                x: input("convtune x", xs),
                w: input("convtune w", ws),
                bias: bias.map(|b| input("convtune bias", b.len() as u64 * 4)),
                y: dev.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("convtune y"),
                    size: ys,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
            };
            engine.queue.write_buffer(&t.x, 0, bytes(x));
            engine.queue.write_buffer(&t.w, 0, bytes(w));
            if let (Some(buf), Some(b)) = (&t.bias, bias) {
                engine.queue.write_buffer(buf, 0, bytes(b));
            }
            t
        })?;
        Ok(t)
    }

    /// Fills the output with the poison pattern so unwritten elements show.
    pub fn poison(&self, engine: &Engine) {
        let poison = vec![f32::from_bits(POISON_BITS); self.shape.y_len() as usize];
        engine.queue.write_buffer(&self.y, 0, bytes(&poison));
    }

    fn bind_group(&self, engine: &Engine) -> wgpu::BindGroup {
        let bias = self.bias.as_ref().unwrap_or(&engine.no_bias);
        engine.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("convtune conv2d"),
            layout: &engine.bind_layout,
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: self.x.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: self.w.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: bias.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 3, resource: self.y.as_entire_binding() },
            ],
        })
    }

    /// Records one dispatch of `kernel`, optionally bracketed by timestamp queries.
    fn encode(
        &self,
        engine: &Engine,
        encoder: &mut wgpu::CommandEncoder,
        kernel: &Compiled,
        bind_group: &wgpu::BindGroup,
        timestamps: Option<(&wgpu::QuerySet, u32)>,
    ) -> Result<()> {
        let max = engine.limits.max_compute_workgroups_per_dimension.max(1) as u64;
        let gx = kernel.workgroups.min(max);
        let gy = kernel.workgroups.div_ceil(gx.max(1));
        if gy > max {
            return Err(Error::invalid(format!(
                "the problem needs {} workgroups, more than this adapter can dispatch",
                kernel.workgroups
            )));
        }
        let timestamp_writes = timestamps.map(|(qs, i)| wgpu::ComputePassTimestampWrites {
            query_set: qs,
            beginning_of_pass_write_index: Some(i),
            end_of_pass_write_index: Some(i + 1),
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("convtune conv2d"),
            timestamp_writes,
        });
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, bind_group, &[]);
        pass.dispatch_workgroups(gx as u32, gy as u32, 1);
        Ok(())
    }

    /// Runs `kernel` once and waits for it.
    pub fn run(&self, engine: &Engine, kernel: &Compiled) -> Result<()> {
        scoped(engine, || -> Result<()> {
            let bg = self.bind_group(engine);
            let mut enc = engine.device.create_command_encoder(&Default::default());
            self.encode(engine, &mut enc, kernel, &bg, None)?;
            let idx = engine.queue.submit([enc.finish()]);
            wait(engine, Some(idx))
        })?
    }

    /// Copies the output into `out`.
    pub fn read_y(&self, engine: &Engine, out: &mut [f32]) -> Result<()> {
        // SAFETY: f32 has no invalid bit patterns, so any bytes written are valid f32s.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(out))
        };
        read_buffer(engine, &self.y, dst)
    }

    /// GPU time of `reps` runs of `kernel`, in seconds each: timestamp queries around each
    /// dispatch where the adapter has them, else wall clock around a queue sync.
    pub fn time(&self, engine: &Engine, kernel: &Compiled, reps: u32) -> Result<Vec<f64>> {
        let reps = reps.clamp(1, 1024);
        let bg = self.bind_group(engine);
        if !engine.has_timestamps() {
            let mut out = Vec::with_capacity(reps as usize);
            for _ in 0..reps {
                let t0 = Instant::now();
                let mut enc = engine.device.create_command_encoder(&Default::default());
                self.encode(engine, &mut enc, kernel, &bg, None)?;
                let idx = engine.queue.submit([enc.finish()]);
                wait(engine, Some(idx))?;
                out.push(t0.elapsed().as_secs_f64());
            }
            return Ok(out);
        }
        let count = 2 * reps;
        let (qs, resolve) = scoped(engine, || {
            let qs = engine.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("convtune timing"),
                ty: wgpu::QueryType::Timestamp,
                count,
            });
            let resolve = engine.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("convtune timing"),
                size: count as u64 * 8,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            (qs, resolve)
        })?;
        let mut enc = engine.device.create_command_encoder(&Default::default());
        for i in 0..reps {
            self.encode(engine, &mut enc, kernel, &bg, Some((&qs, 2 * i)))?;
        }
        enc.resolve_query_set(&qs, 0..count, &resolve, 0);
        let idx = engine.queue.submit([enc.finish()]);
        wait(engine, Some(idx))?;
        let mut raw = vec![0u8; count as usize * 8];
        read_buffer(engine, &resolve, &mut raw)?;
        let period = engine.queue.get_timestamp_period() as f64;
        let ticks: Vec<u64> = raw
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8-byte chunk")))
            .collect();
        Ok(ticks
            .chunks(2)
            .map(|p| p[1].saturating_sub(p[0]) as f64 * period * 1e-9)
            .collect())
    }
}

/// Waits for a submission (or all work) to finish, bounded so a hung GPU gives an error.
fn wait(engine: &Engine, idx: Option<wgpu::SubmissionIndex>) -> Result<()> {
    engine
        .device
        .poll(wgpu::PollType::Wait { submission_index: idx, timeout: Some(GPU_WAIT) })
        .map(|_| ())
        .map_err(|e| match e {
            wgpu::PollError::Timeout => {
                Error::Gpu(format!("the GPU did not finish within {} s", GPU_WAIT.as_secs()))
            }
            other => Error::DeviceLost(other.to_string()),
        })
}

/// Copies a GPU buffer into `out` through a mappable staging buffer.
fn read_buffer(engine: &Engine, src: &wgpu::Buffer, out: &mut [u8]) -> Result<()> {
    let size = out.len() as u64;
    let staging = scoped(engine, || {
        engine.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("convtune read-back"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    })?;
    let mut enc = engine.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, 0, &staging, 0, size);
    let idx = engine.queue.submit([enc.finish()]);
    let (tx, rx) = mpsc::channel();
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    wait(engine, Some(idx))?;
    rx.recv_timeout(GPU_WAIT)
        .map_err(|_| Error::Gpu("read-back of the output never completed".into()))?
        .map_err(|e| Error::Gpu(format!("mapping the output failed: {e}")))?;
    {
        let view = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("mapping the output failed: {e}")))?;
        out.copy_from_slice(&view);
    }
    staging.unmap();
    Ok(())
}

/// One conv2d: upload, run `variant`, read the output into `out` (length `shape.y_len()`).
pub fn conv2d(
    engine: &Engine,
    shape: &ConvShape,
    variant: &Variant,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    poison: bool,
) -> Result<()> {
    let kernel = engine.pipeline(variant, shape)?;
    let t = DeviceTensors::upload(engine, shape, x, w, bias)?;
    if poison {
        t.poison(engine);
    }
    t.run(engine, &kernel)?;
    t.read_y(engine, out)
}

/// Deterministic pseudo-random values in [-1, 1), never all zero: timing and tuning inputs.
pub fn random_data(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::device::engine;
    use crate::params::Padding;
    use crate::variants::all_variants;

    /// Naive float64 reference with PyTorch semantics.
    pub(crate) fn reference(s: &ConvShape, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f64> {
        let (oh, ow, cg, kg) = (s.oh() as i64, s.ow() as i64, s.cg() as i64, s.kg() as i64);
        let (c, h, wd, k, r, sz) = (s.c as i64, s.h as i64, s.w as i64, s.k as i64, s.r as i64, s.s as i64);
        let mut y = vec![0f64; s.y_len() as usize];
        for n in 0..s.n as i64 {
            for kk in 0..k {
                let g = kk / kg;
                for i in 0..oh {
                    for j in 0..ow {
                        let mut acc = b.map_or(0.0, |b| b[kk as usize] as f64);
                        for cc in 0..cg {
                            for rr in 0..r {
                                for ss in 0..sz {
                                    let ih = i * s.stride.0 as i64 - s.pad.0 as i64 + rr * s.dilation.0 as i64;
                                    let iw = j * s.stride.1 as i64 - s.pad.1 as i64 + ss * s.dilation.1 as i64;
                                    let xv = if ih >= 0 && ih < h && iw >= 0 && iw < wd {
                                        x[(((n * c + g * cg + cc) * h + ih) * wd + iw) as usize] as f64
                                    } else {
                                        0.0
                                    };
                                    acc += xv * w[(((kk * cg + cc) * r + rr) * sz + ss) as usize] as f64;
                                }
                            }
                        }
                        y[(((n * k + kk) * oh + i) * ow + j) as usize] = acc;
                    }
                }
            }
        }
        y
    }

    pub(crate) fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
        let scale = want.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
        got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs() / scale).fold(0.0, f64::max)
    }

    #[test]
    fn every_variant_computes_the_reference_on_a_small_shape() {
        let e = engine().expect("a Vulkan adapter (lavapipe in CI)");
        let s = ConvShape::new([2, 6, 9, 7], [4, 3, 3, 2], (2, 1), Padding::Explicit(1, 2), (1, 2), 2, Some(4))
            .unwrap();
        let x = random_data(s.x_len() as usize, 1);
        let w = random_data(s.w_len() as usize, 2);
        let b = random_data(4, 3);
        let want = reference(&s, &x, &w, Some(&b));
        let mut got = vec![0f32; s.y_len() as usize];
        for v in all_variants().into_iter().filter(|v| v.fits(&e.limits)) {
            conv2d(&e, &s, &v, &x, &w, Some(&b), &mut got, true).unwrap();
            let err = max_rel_err(&got, &want);
            assert!(err <= 1e-5, "{v}: max relative error {err}");
        }
    }
}
