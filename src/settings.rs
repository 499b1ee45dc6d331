//! Settings read from the environment.

/// A positive integer from environment variable `name`; `None` where it is unset, empty, not
/// a number or zero (the caller's default then holds).
pub fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok().filter(|&v| v > 0)
}
