//! Convolutions on host slices: upload, run, read back, as Python's numpy calls do.

use crate::dtype::Elem;
use crate::engine::Engine;
use crate::error::{no_panic, Error, Result};
use crate::plan::Plan;
use crate::problem::Conv2d;
use crate::runner;
use crate::timing::Phases;
use std::sync::atomic::{AtomicBool, Ordering};

/// Poisoning outputs before each run costs a GPU fill pass; tests turn it on.
static POISON: AtomicBool = AtomicBool::new(false);

/// Tests: fill every output with a poison pattern before its kernel runs, so elements a
/// kernel fails to write show.
#[doc(hidden)]
pub fn set_poison(on: bool) {
    POISON.store(on, Ordering::Relaxed);
}

pub(crate) fn poison() -> bool {
    POISON.load(Ordering::Relaxed)
}

/// An error unless `data` holds `want` elements.
pub(crate) fn expect_len(what: &str, len: usize, want: u64) -> Result<()> {
    if len as u64 != want {
        return Err(Error::invalid(format!("{what} must hold {want} elements for this problem, got {len}")));
    }
    Ok(())
}

/// An error unless an optional input is present exactly when the problem has it.
pub(crate) fn expect_present(what: &str, given: bool, wanted: bool) -> Result<()> {
    match (given, wanted) {
        (true, false) => Err(Error::invalid(format!("{what} given, but the problem has none (see Conv2dBuilder)"))),
        (false, true) => Err(Error::invalid(format!("the problem has {what}, but none was given"))),
        _ => Ok(()),
    }
}

/// An error unless w, the bias and z are what `p` takes: `z` is `None` without a residual,
/// `Some(None)` for a device tensor (checked elsewhere), `Some(Some(len))` for host data.
pub(crate) fn expect_operands(p: &Conv2d, w: usize, bias: Option<&[f32]>, z: Option<Option<usize>>) -> Result<()> {
    let [_, wl, yl] = p.lens();
    expect_len("w", w, wl)?;
    expect_present("a bias", bias.is_some(), p.has_bias())?;
    if let Some(b) = bias {
        expect_len("the bias", b.len(), p.shape.k.into())?;
    }
    expect_present("a residual z", z.is_some(), p.has_residual())?;
    match z {
        Some(Some(len)) => expect_len("z", len, yl),
        _ => Ok(()),
    }
}

impl Engine {
    /// Runs `plan` on host data and returns the output (C-ordered, dims
    /// [`Conv2d::y_dims`](crate::Conv2d::y_dims)). `T` is `f32`, or `u16` holding float16
    /// bits for float16 problems; the bias is float32 either way. Problems larger than one
    /// storage binding run in pieces.
    pub fn conv2d<T: Elem>(&self, plan: &Plan, x: &[T], w: &[T], bias: Option<&[f32]>, z: Option<&[T]>) -> Result<Vec<T>> {
        let mut out = vec![T::from_f32(0.0); plan.problem().lens()[2] as usize];
        self.conv2d_into(plan, x, w, bias, z, &mut out)?;
        Ok(out)
    }

    /// [`conv2d`](Self::conv2d) into `out`. [`last_call_timings`](crate::last_call_timings)
    /// tells where its time went.
    pub fn conv2d_into<T: Elem>(&self, plan: &Plan, x: &[T], w: &[T], bias: Option<&[f32]>, z: Option<&[T]>, out: &mut [T]) -> Result<()> {
        let mut ph = Phases::start();
        self.conv2d_timed(plan, x, w, bias, z, out, &mut ph)?;
        ph.finish();
        Ok(())
    }

    /// [`conv2d_into`](Self::conv2d_into), charging its phases to `ph`.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d_timed<T: Elem>(
        &self,
        plan: &Plan,
        x: &[T],
        w: &[T],
        bias: Option<&[f32]>,
        z: Option<&[T]>,
        out: &mut [T],
        ph: &mut Phases,
    ) -> Result<()> {
        self.check_lost()?;
        let _busy = crate::background::busy();
        let p = plan.problem();
        let [xl, _, yl] = p.lens();
        expect_len("x", x.len(), xl)?;
        expect_len("the output", out.len(), yl)?;
        expect_operands(p, w.len(), bias, z.map(|z| Some(z.len())))?;
        no_panic(|| format!("conv2d on {}", p.label()), || {
            runner::conv2d_timed(&self.inner, &p.shape, &plan.variant, x, w, bias, z, out, poison(), ph)
        })
    }
}
