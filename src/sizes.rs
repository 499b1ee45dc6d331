//! Byte counts written for people, in errors and reports.

/// A size for people: `1.50 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_binary_units() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(3 << 29), "1.50 GiB");
        assert_eq!(human(1 << 40), "1.00 TiB");
    }
}
