//! convtune: autotuned conv2d on any Vulkan GPU, through wgpu.

pub mod autotune;
pub mod cache;
pub mod check;
pub mod codegen;
pub mod device;
pub mod error;
pub mod memory;
pub mod params;
pub mod pool;
pub mod runner;
pub mod split;
pub mod tuner;
pub mod variants;
#[cfg(feature = "python")]
mod python;
