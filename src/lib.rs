//! Autotuned conv2d on any Vulkan GPU (Metal and DX12 too), through [wgpu].
//!
//! convtune generates a WGSL compute shader for each conv *variant* (kernel family,
//! workgroup size, unroll factor, register tile), times the candidates that fit your
//! device, checks each one's output against a trusted kernel, and caches the fastest
//! correct one per problem on disk — the same cache file the Python package uses.
//!
//! # On your own device and buffers
//!
//! An application that already has a [`wgpu::Device`] makes an [`Engine`] on it with
//! [`Engine::from_device`], describes the convolution with [`Conv2d::builder`], chooses its
//! kernel with [`Engine::plan`] (tuning it the first time) and records it into its own
//! [`wgpu::CommandEncoder`] with [`Engine::encode`], between its own passes:
//!
//! ```
//! use convtune::{Conv2d, Conv2dBuffers, Engine};
//! use wgpu::util::DeviceExt;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The application's own device (here on the first adapter wgpu finds).
//! let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
//! let adapter = pollster::block_on(instance.request_adapter(&Default::default()))?;
//! let (device, queue) = pollster::block_on(adapter.request_device(&Default::default()))?;
//!
//! let engine = Engine::from_device(&adapter, &device, &queue)?;
//! // x: (N, C, H, W) = (1, 3, 8, 8); w: (K, C, R, S) = (4, 3, 3, 3); padding 1.
//! let problem = Conv2d::builder([1, 3, 8, 8], [4, 3, 3, 3]).padding(1).build()?;
//! let plan = engine.plan(&problem)?;
//!
//! let x: Vec<f32> = (0..3 * 64).map(|i| (i % 7) as f32 - 3.0).collect();
//! let w: Vec<f32> = (0..4 * 27).map(|i| (i % 5) as f32 * 0.25).collect();
//! let storage = |data: &[f32]| {
//!     device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
//!         label: None,
//!         contents: bytemuck::cast_slice(data),
//!         usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
//!     })
//! };
//! let (xb, wb) = (storage(&x), storage(&w));
//! let yb = storage(&vec![0.0; 4 * 64]);
//!
//! let mut encoder = device.create_command_encoder(&Default::default());
//! // ... the application's passes that write x ...
//! let buffers = Conv2dBuffers { x: xb.slice(..), w: wb.slice(..), bias: None, z: None, y: yb.slice(..) };
//! let workspace = engine.encode(&mut encoder, &plan, &buffers)?;
//! // ... passes that read y ...
//! queue.submit([encoder.finish()]);
//! drop(workspace); // after the submission
//! # Ok(())
//! # }
//! ```
//!
//! `examples/own_device.rs` goes on to read y back and check it against a float64
//! reference, with a pass of its own after the convolution.
//!
//! # On host slices
//!
//! [`Engine::shared`] opens the best adapter (as Python does) and [`Engine::conv2d`] takes
//! and returns host data:
//!
//! ```
//! use convtune::{Conv2d, Engine};
//!
//! # fn main() -> Result<(), convtune::Error> {
//! let engine = Engine::shared()?;
//! let problem = Conv2d::builder([2, 4, 6, 6], [8, 4, 3, 3]).stride(2).bias(true).build()?;
//! let plan = engine.plan(&problem)?;
//! let x = vec![1.0f32; 2 * 4 * 36];
//! let w = vec![0.5f32; 8 * 4 * 9];
//! let bias = vec![0.25f32; 8];
//! let y = engine.conv2d(&plan, &x, &w, Some(&bias), None)?;
//! assert_eq!(y.len(), problem.y_dims().iter().product::<usize>());
//! // An output pixel whose 3x3 window lies inside the image sums 4 * 9 ones times 0.5.
//! assert_eq!(y[problem.y_dims()[3] + 1], 4.0 * 9.0 * 0.5 + 0.25);
//! # Ok(())
//! # }
//! ```
//!
//! # Tuning
//!
//! [`Engine::plan`] follows `CONVTUNE_TUNE` (`auto`: tune a new problem, then use the
//! cache; `cached`; `off`) and the other `CONVTUNE_*` variables the README lists;
//! [`Engine::tune`] tunes on request and [`Engine::explain`] returns the [`Plan`] with its
//! [`Report`] (every candidate and its times) and [`Plan::wgsl`]. Results live in the
//! file [`cache_path`] names, shared with Python.
//!
//! # Errors
//!
//! Every fallible call returns [`Error`]; nothing panics across the API.

#![warn(missing_docs)]

mod autotune;
mod background;
mod cache;
mod check;
mod codegen;
mod compiling;
mod deadline;
mod device;
mod dtype;
mod encode;
mod engine;
mod epilogue;
mod error;
mod families;
mod first_run;
mod generic;
mod host;
// Some helpers of the kernel families serve their tests and tools only.
#[allow(dead_code)]
mod kernel_cache;
mod kernels;
mod memory;
mod params;
mod plan;
mod pool;
mod precision;
mod problem;
pub mod reference;
mod resident;
mod runner;
mod settings;
mod sizes;
mod submit;
mod split;
mod tensor;
mod timing;
mod transfer;
mod tuner;
mod tuning_cache;
mod wait;
#[doc(hidden)]
pub mod support;
#[cfg(feature = "python")]
mod python;

pub use device::{memory_hints, AdapterDesc, OPTIONAL_FEATURES};
pub use dtype::{DType, Elem as Element};
pub use encode::{Conv2dBuffers, Workspace};
pub use engine::{adapters, Engine};
pub use epilogue::Activation;
pub use error::{Error, Result};
pub use kernel_cache::KernelCacheStats;
pub use params::{Layout, Padding, PaddingMode};
pub use background::{TuningDone, TuningStatus};
pub use plan::{
    families, set_tune_mode, stop_tuning, tune_mode, tuning_status, variant_knobs, variant_names, wait_tuning, Candidate, Plan, Progress,
    ProgressFn, Report, TuneOptions,
};
pub use pool::PoolStats;
pub use precision::Precision;
pub use problem::{Conv2d, Conv2dBuilder, Hw, TensorBytes};
pub use tensor::{Residual, Tensor, Weights};
pub use tuner::TuningPhases;
pub use tuning_cache::{cache_clear, cache_export, cache_import, cache_path};

/// The phases of this thread's last [`Engine::conv2d`] call, seconds each, in the order
/// they ran (argument checks, upload, kernel, read-back, …), and the process's minor page
/// faults during it (`None` where they cannot be read).
pub fn last_call_timings() -> (Vec<(&'static str, f64)>, Option<u64>) {
    support::last_call_timings()
}
