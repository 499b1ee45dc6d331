//! The one error type of the crate. Python sees it through `python::to_pyerr`, the only place
//! where errors cross into Python.

use thiserror::Error;

/// convtune's results.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in a convtune call, each with a message saying what and,
/// where there is one, what to do about it.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A shape or parameter the caller gave is not acceptable (Python: ValueError).
    #[error("{0}")]
    InvalidArgument(String),
    /// An argument of the wrong type or dtype (Python: TypeError).
    #[error("{0}")]
    InvalidType(String),
    /// No usable GPU adapter, or no Vulkan loader (Python: convtune.NoAdapterError).
    #[error("{0}")]
    NoAdapter(String),
    /// The GPU ran out of memory for this call (Python: convtune.OutOfMemoryError).
    #[error("GPU out of memory: {0}")]
    OutOfMemory(String),
    /// A call would need more host or GPU memory than there is; found before allocating
    /// (Python: convtune.OutOfMemoryError).
    #[error("{0}")]
    MemoryLimit(String),
    /// A device the caller opened lacks a feature or limit every kernel needs; the message
    /// names each one (Python: never raised, its device is convtune's own).
    #[error("{0}")]
    Unsupported(String),
    /// The device was lost; the next call creates a new one (Python: convtune.DeviceLostError).
    #[error("GPU device lost: {0}")]
    DeviceLost(String),
    /// Generated WGSL failed to validate or compile (Python: convtune.ShaderError).
    #[error("shader for variant {variant} failed to compile: {message}")]
    Shader {
        /// The variant's name.
        variant: String,
        /// What the compiler said.
        message: String,
    },
    /// Any other GPU-side failure (Python: convtune.ConvtuneError).
    #[error("GPU error: {0}")]
    Gpu(String),
    /// The tuning cache could not be read or written (Python: convtune.ConvtuneError).
    #[error("tuning cache: {0}")]
    Cache(String),
    /// The process was forked after convtune opened its device; the message says what to
    /// do instead (Python: convtune.ConvtuneError).
    #[error("{0}")]
    Forked(String),
    /// A panic inside convtune or a dependency, caught at the API's edge: the call failed,
    /// the engine stays usable (Python: convtune.InternalError).
    #[error("internal error: {0}")]
    Internal(String),
    /// Tuning was stopped by its progress callback (Python: whatever the callback raised).
    #[error("tuning cancelled: {0}")]
    Cancelled(String),
}

/// `f`, with a panic inside it (convtune's or a dependency's) returned as
/// [`Error::Internal`] naming `what` (worked out only then: the entry points that run GPU
/// work go through this on every call), so a panic fails one call and leaves the engine
/// usable.
pub(crate) fn no_panic<T>(what: impl FnOnce() -> String, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        Err(Error::Internal(format!("{} panicked: {}", what(), panic_message(payload.as_ref()))))
    })
}

/// The text a panic was raised with.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".into(),
    }
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

impl From<wgpu::Error> for Error {
    fn from(e: wgpu::Error) -> Self {
        match e {
            wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory(e.to_string()),
            other => Error::Gpu(other.to_string()),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Cache(e.to_string())
    }
}
