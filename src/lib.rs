//! convtune: autotuned conv2d on any Vulkan GPU, through wgpu.

pub mod autotune;
pub mod cache;
pub mod check;
pub mod codegen;
pub mod device;
pub mod dtype;
pub mod epilogue;
pub mod error;
pub mod families;
pub mod kernels;
pub mod memory;
pub mod params;
pub mod pool;
pub mod precision;
pub mod runner;
pub mod split;
pub mod timing;
pub mod transfer;
pub mod tuner;
#[cfg(feature = "python")]
mod python;
