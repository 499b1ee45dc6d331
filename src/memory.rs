//! Memory checks made before anything proportional to a problem's size is allocated.
//!
//! A zero-stride numpy view can describe terabytes with a few bytes behind it, and a few
//! bytes of input with a large padding can ask for a huge output. On a machine that
//! overcommits memory such an allocation succeeds and the process is killed while filling
//! it, so every entry point works out the bytes a call needs (`Need`) from the shapes alone
//! and compares them with what the host and the GPU have before it copies or allocates.

use crate::device::Engine;
use crate::error::{Error, Result};
use crate::params::ConvShape;
use crate::pool::size_class;
use crate::sizes::human;
use crate::split;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Host needs below this are not checked: reading the limits costs tens of microseconds
/// per call, and a process that cannot find 16 MiB is failing anyway.
const HOST_UNCHECKED_BELOW: u64 = 16 << 20;
/// How long a reading of the host's free memory serves later calls.
const HOST_READING_KEPT: Duration = Duration::from_millis(250);

/// The bytes one call needs, by what they are for (for the error message).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Need {
    pub host: Vec<(String, u64)>,
    pub device: Vec<(String, u64)>,
}

fn total(parts: &[(String, u64)]) -> u64 {
    parts.iter().fold(0u64, |acc, (_, b)| acc.saturating_add(*b))
}

fn f32_bytes(elems: u64) -> u64 {
    elems.saturating_mul(4)
}

/// Bytes of `elems` elements of the problem's data type (x, w, z, y).
fn data_bytes(shape: &ConvShape, elems: u64) -> u64 {
    elems.saturating_mul(shape.dtype.size())
}

fn part(label: &str, bytes: u64) -> (String, u64) {
    (label.to_string(), bytes)
}

/// Memory that can be had, and where the figure comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Available {
    pub bytes: u64,
    pub source: String,
}

/// The tightest of several limits (`None` when none is known).
fn tightest(limits: impl IntoIterator<Item = Option<Available>>) -> Option<Available> {
    limits.into_iter().flatten().min_by_key(|a| a.bytes)
}

fn breakdown(parts: &[(String, u64)]) -> String {
    parts
        .iter()
        .filter(|(_, b)| *b > 0)
        .map(|(label, b)| format!("{label} {b}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An error when `parts` need more than `available`; `kind` is "host" or "GPU".
pub fn check_against(what: &str, kind: &str, parts: &[(String, u64)], available: Option<&Available>) -> Result<()> {
    let need = total(parts);
    match available {
        Some(a) if need > a.bytes => Err(Error::MemoryLimit(format!(
            "{what} needs {need} bytes ({}) of {kind} memory ({}), more than the {} bytes ({}) \
             available ({})",
            human(need),
            breakdown(parts),
            a.bytes,
            human(a.bytes),
            a.source
        ))),
        _ => Ok(()),
    }
}

/// Checks a call's needs against the GPU's and the host's memory.
pub fn check(engine: &Engine, what: &str, need: &Need) -> Result<()> {
    check_against(what, "GPU", &need.device, device_available(engine).as_ref())?;
    let host = total(&need.host);
    if host >= HOST_UNCHECKED_BELOW {
        // A recent reading serves calls that need at most half of what it found free.
        let avail = host_reading(false).filter(|a| host <= a.bytes / 2).or_else(|| host_reading(true));
        check_against(what, "host", &need.host, avail.as_ref())?;
    }
    Ok(())
}

/// GPU memory a call may still take: the largest device-local heap less what convtune's
/// live buffers hold. Idle pool buffers are not counted: the pool frees them when an
/// allocation fails. Where the heap size is unknown (wgpu reports it for no backend; it is
/// read from Vulkan directly) only the per-buffer limits and the pool's handling of
/// out-of-memory errors apply.
pub fn device_available(engine: &Engine) -> Option<Available> {
    let heap = engine.device_heap?;
    let live = engine.pool.stats().live_device;
    Some(Available {
        bytes: heap.saturating_sub(live),
        source: format!("the adapter's device-local heap of {heap} bytes, {live} of them held by live convtune buffers"),
    })
}

/// Host memory the process may still take: the tightest of the kernel's estimate of
/// available memory, the cgroup's limit and the address-space limit; the system-wide part
/// (free memory and the cgroups' room) from a reading taken less than `HOST_READING_KEPT` ago unless `fresh`: reading /proc/meminfo and
/// the cgroup files took 0.2-0.4 ms, more than a short call's kernel. The address-space
/// limit is this process's own and cheap to read: always current.
fn host_reading(fresh: bool) -> Option<Available> {
    static LAST: Mutex<Option<(Instant, Option<Available>)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let system = match last.as_ref() {
        Some((at, avail)) if !fresh && at.elapsed() < HOST_READING_KEPT => avail.clone(),
        _ => {
            let avail = tightest([physical_available(), cgroup_available()]);
            *last = Some((Instant::now(), avail.clone()));
            avail
        }
    };
    tightest([system, address_space_available()])
}

// ---------------------------------------------------------------------------------------
// What each call needs
// ---------------------------------------------------------------------------------------

/// `conv2d` on host arrays (`runner::conv2d`): the weights stay on the GPU while the pieces
/// of the problem pass through one at a time, each uploaded through a staging copy and
/// read back through another; row bands are gathered on the host and split outputs
/// scattered through a temporary.
pub fn conv2d_host(shape: &ConvShape, max_binding: u64) -> Result<Need> {
    let pieces = split::plan(shape, max_binding)?;
    let subs = || pieces.iter().filter_map(|p| p.shape);
    let x_piece = subs().map(|s| data_bytes(shape, s.x_len())).max().unwrap_or(0);
    let y_piece = subs().map(|s| data_bytes(shape, s.y_len())).max().unwrap_or(0);
    let banded = pieces.iter().any(|p| p.rows != shape.oh());
    let weights = weight_bytes(shape);
    // The epilogue's residual travels like the output, in pieces of its size.
    let z_piece = residual(shape, y_piece);
    Ok(Need {
        host: vec![
            part("output", data_bytes(shape, shape.y_len())),
            part("staging", weights + x_piece + y_piece + z_piece),
            part("row-band buffers", if banded { x_piece + y_piece } else { 0 }),
        ],
        device: vec![
            part("weights", size_class(weights)),
            part("input", size_class(x_piece)),
            part("output", size_class(y_piece)),
            part("residual", residual_class(z_piece)),
        ],
    })
}

/// `conv2d` on a GPU-resident input: the output is one more GPU tensor, so it must fit
/// one binding.
pub fn conv2d_device(shape: &ConvShape, max_binding: u64) -> Result<Need> {
    let y = data_bytes(shape, shape.y_len());
    binding_fits("w", data_bytes(shape, shape.w_len()), max_binding)?;
    binding_fits("the output", y, max_binding)?;
    let weights = weight_bytes(shape);
    // A residual given as a host array is uploaded (one given as a Tensor costs nothing).
    let z = residual(shape, y);
    Ok(Need {
        host: vec![part("staging", weights + z)],
        device: vec![
            part("weights", size_class(weights)),
            part("output", size_class(y)),
            part("residual", residual_class(z)),
        ],
    })
}

/// A run of the whole problem on random inputs, as tuning and timing make it: x, w and y
/// each in one binding (no splitting), the inputs made on the host, and the output kept
/// twice on each side (a reference and the candidate's).
pub fn whole_problem(shape: &ConvShape, max_binding: u64) -> Result<Need> {
    let (x, y) = (data_bytes(shape, shape.x_len()), data_bytes(shape, shape.y_len()));
    binding_fits("x", x, max_binding)?;
    binding_fits("w", data_bytes(shape, shape.w_len()), max_binding)?;
    binding_fits("the output", y, max_binding)?;
    let weights = weight_bytes(shape);
    let z = residual(shape, y);
    Ok(Need {
        host: vec![
            part("random inputs", x + weights + z),
            part("outputs", 2 * y),
            part("staging", x + weights + y + z),
        ],
        device: vec![
            part("input", size_class(x)),
            part("weights", size_class(weights)),
            part("outputs", 2 * size_class(y)),
            part("residual", residual_class(z)),
        ],
    })
}

/// `to_device`: one buffer on the GPU, filled through a staging copy.
pub fn upload(elems: u64, max_binding: u64) -> Result<Need> {
    let bytes = f32_bytes(elems);
    binding_fits("the tensor", bytes, max_binding)?;
    Ok(Need { host: vec![part("staging", bytes)], device: vec![part("tensor", size_class(bytes))] })
}

/// `Tensor.numpy()`: a new array, filled through a read-back staging buffer.
pub fn download(elems: u64) -> Need {
    let bytes = f32_bytes(elems);
    Need { host: vec![part("output", bytes), part("staging", bytes)], device: Vec::new() }
}

/// Bytes of the epilogue's residual when the problem has one (`y` bytes), else 0.
fn residual(shape: &ConvShape, y: u64) -> u64 {
    if shape.epilogue.residual { y } else { 0 }
}

/// The GPU buffer a residual of `bytes` takes from the pool; none for a problem without one.
fn residual_class(bytes: u64) -> u64 {
    if bytes > 0 { size_class(bytes) } else { 0 }
}

fn weight_bytes(shape: &ConvShape) -> u64 {
    // The bias is float32 whatever the data type.
    data_bytes(shape, shape.w_len()) + f32_bytes(if shape.bias { shape.k as u64 } else { 0 })
}

fn binding_fits(what: &str, bytes: u64, max_binding: u64) -> Result<()> {
    if bytes > max_binding {
        return Err(Error::invalid(format!(
            "{what} needs {bytes} bytes, more than the adapter's largest storage buffer \
             ({max_binding} bytes)"
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Host limits
// ---------------------------------------------------------------------------------------

/// The value of `key` (in kB) in a /proc file of `key: value kB` lines, in bytes.
fn proc_kb(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb.saturating_mul(1024))
    })
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The kernel's estimate of memory available without swapping, else free physical pages.
fn physical_available() -> Option<Available> {
    if let Some(bytes) = read("/proc/meminfo").and_then(|t| proc_kb(&t, "MemAvailable")) {
        return Some(Available { bytes, source: "MemAvailable in /proc/meminfo".into() });
    }
    sysconf_available()
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn sysconf_available() -> Option<Available> {
    // SAFETY: sysconf only reads system configuration.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_AVPHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || size <= 0 {
        return None;
    }
    Some(Available { bytes: (pages as u64).saturating_mul(size as u64), source: "free physical pages".into() })
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn sysconf_available() -> Option<Available> {
    None
}

/// The cgroup (v2) directory of this process, from a /proc/self/cgroup text.
fn cgroup_dir(proc_self_cgroup: &str) -> Option<String> {
    let path = proc_self_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(format!("/sys/fs/cgroup{}", path.trim_end_matches('/')))
}

/// Room left under one cgroup's `memory.max`: its page cache (`inactive_file`) counts as
/// free, since the kernel reclaims it before it kills.
fn cgroup_room(max: &str, current: &str, stat: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?; // "max" (no limit) does not parse
    let current: u64 = current.trim().parse().ok()?;
    let cache = stat
        .lines()
        .find_map(|l| l.strip_prefix("inactive_file ")?.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Some(max.saturating_sub(current.saturating_sub(cache)))
}

/// The tightest `memory.max` of this process's cgroup and its ancestors.
fn cgroup_available() -> Option<Available> {
    let mut dir = cgroup_dir(&read("/proc/self/cgroup")?)?;
    let mut best: Option<Available> = None;
    loop {
        let room = read(&format!("{dir}/memory.max")).and_then(|max| {
            let current = read(&format!("{dir}/memory.current"))?;
            cgroup_room(&max, &current, &read(&format!("{dir}/memory.stat")).unwrap_or_default())
        });
        if let Some(bytes) = room {
            let here = Available { bytes, source: format!("the memory.max of cgroup {dir}") };
            best = tightest([best, Some(here)]);
        }
        match dir.rfind('/') {
            Some(i) if dir[..i].len() >= "/sys/fs/cgroup".len() => dir.truncate(i),
            _ => return best,
        }
    }
}

/// Room left under the address-space limit (`RLIMIT_AS`): the limit less the process's
/// current virtual size.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn address_space_available() -> Option<Available> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    let used = read("/proc/self/status").and_then(|t| proc_kb(&t, "VmSize")).unwrap_or(0);
    #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
    let cap = lim.rlim_cur as u64;
    Some(Available {
        bytes: cap.saturating_sub(used),
        source: format!("the address-space limit RLIMIT_AS of {cap} bytes, {used} of them in use"),
    })
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn address_space_available() -> Option<Available> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Padding;

    fn shape(x: [usize; 4], w: [usize; 4], pad: i64) -> ConvShape {
        ConvShape::new(x, w, (1, 1), Padding::Explicit(pad, pad), (1, 1), 1, Some(w[0])).unwrap()
    }

    #[test]
    fn reads_proc_values_in_bytes() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(proc_kb(meminfo, "MemAvailable"), Some(2048 * 1024));
        assert_eq!(proc_kb(meminfo, "MemFre"), None);
        assert_eq!(proc_kb("VmPeak:\t 10 kB\nVmSize:\t  7 kB\n", "VmSize"), Some(7 * 1024));
    }

    #[test]
    fn cgroup_room_counts_page_cache_as_free() {
        assert_eq!(cgroup_room("1000\n", "800\n", "anon 500\ninactive_file 300\n"), Some(500));
        assert_eq!(cgroup_room("max\n", "800\n", ""), None);
        assert_eq!(cgroup_room("1000", "1200", ""), Some(0));
        assert_eq!(cgroup_dir("0::/user.slice/a.scope\n").as_deref(), Some("/sys/fs/cgroup/user.slice/a.scope"));
        assert_eq!(cgroup_dir("0::/\n").as_deref(), Some("/sys/fs/cgroup"));
        assert_eq!(cgroup_dir("4:memory:/docker/abc\n"), None);
    }

    #[test]
    fn over_the_limit_names_the_bytes_and_the_limit() {
        let parts = vec![part("output", 3 << 30), part("staging", 1 << 30), part("gathers", 0)];
        let limit = Available { bytes: 2 << 30, source: "test limit".into() };
        let err = check_against("conv2d", "host", &parts, Some(&limit)).unwrap_err();
        assert!(matches!(err, Error::MemoryLimit(_)));
        let msg = err.to_string();
        assert!(msg.contains(&(4u64 << 30).to_string()) && msg.contains("4.00 GiB"), "{msg}");
        assert!(msg.contains(&(2u64 << 30).to_string()) && msg.contains("test limit"), "{msg}");
        assert!(msg.contains("output 3221225472") && !msg.contains("gathers"), "{msg}");
        assert!(check_against("conv2d", "host", &parts, Some(&Available { bytes: 4 << 30, ..limit })).is_ok());
        assert!(check_against("conv2d", "host", &parts, None).is_ok());
    }

    #[test]
    fn tightest_limit_wins() {
        let a = |bytes, s: &str| Some(Available { bytes, source: s.into() });
        assert_eq!(tightest([a(5, "a"), None, a(3, "b")]).unwrap().source, "b");
        assert_eq!(tightest([None, None]), None);
    }

    #[test]
    fn whole_problem_needs_its_tensors_once() {
        let s = shape([2, 3, 8, 8], [4, 3, 3, 3], 1);
        let need = conv2d_host(&s, 1 << 20).unwrap();
        let (x, y, w) = (4 * s.x_len(), 4 * s.y_len(), 4 * (s.w_len() + 4));
        assert_eq!(need.host[0], part("output", y));
        assert_eq!(need.host[1], part("staging", w + x + y));
        assert_eq!(need.host[2].1, 0);
        assert_eq!(total(&need.device), size_class(w) + size_class(x) + size_class(y));
        // float16 data takes half the bytes; the bias stays float32.
        let half = s.with_dtype(crate::dtype::DType::F16);
        let need = conv2d_host(&half, 1 << 20).unwrap();
        let (x, y, w) = (2 * s.x_len(), 2 * s.y_len(), 2 * s.w_len() + 4 * 4);
        assert_eq!(need.host[0], part("output", y));
        assert_eq!(need.host[1], part("staging", w + x + y));
    }

    #[test]
    fn split_problems_need_one_piece_on_the_gpu() {
        // A huge padding: a 4-byte input asks for a 6.4 GB output, which runs as row bands.
        let s = shape([1, 1, 1, 1], [1, 1, 1, 1], 20_000);
        let binding = 128 << 20;
        let need = conv2d_host(&s, binding).unwrap();
        assert_eq!(need.host[0].1, 4 * 40_001 * 40_001);
        assert!(need.host[2].1 > 0, "row bands are gathered on the host");
        assert!(total(&need.device) <= 4 + 2 * size_class(binding), "{need:?}");
    }

    #[test]
    fn gpu_resident_results_must_fit_one_binding() {
        let s = shape([1, 4, 64, 64], [8, 4, 3, 3], 1);
        assert!(conv2d_device(&s, 1 << 20).is_ok());
        assert!(matches!(conv2d_device(&s, 1 << 16), Err(Error::InvalidArgument(_))));
        let wide = shape([1, 4, 8, 8], [512, 4, 8, 8], 0); // w: 512 KiB, y: 2 KiB
        assert!(matches!(conv2d_device(&wide, 500 << 10), Err(Error::InvalidArgument(m)) if m.starts_with("w needs")));
        assert!(matches!(upload(1 << 20, 1 << 20), Err(Error::InvalidArgument(_))));
        assert_eq!(download(10).host.iter().map(|p| p.1).sum::<u64>(), 80);
        let need = whole_problem(&s, 1 << 20).unwrap();
        assert_eq!(need.host[1].1, 2 * 4 * s.y_len());
        assert!(matches!(whole_problem(&s, 1 << 15), Err(Error::InvalidArgument(m)) if m.starts_with("x needs")));
    }
}
