//! convtune: autotuned conv2d on any Vulkan GPU, through wgpu.

pub mod codegen;
pub mod error;
pub mod params;
pub mod pool;
pub mod split;
pub mod variants;
pub mod device;
pub mod runner;
#[cfg(feature = "python")]
mod python;
