//! Splitting one conv2d into pieces that fit the adapter: every tensor a kernel binds must fit
//! in one storage binding (128 MiB on lavapipe, 2 GiB on big GPUs). Pieces are whole images
//! when an image fits, else bands of output rows of one image, each with the input rows its
//! windows read (padding at a band's edge is real padding only at the image's edge).

use crate::error::{Error, Result};
use crate::params::{ConvShape, Layout};

/// One piece: output rows `oh0..oh0 + shape.oh()` of images `n0..n0 + shape.n`, computed as
/// the conv `shape` over input rows `ih0..ih0 + shape.h`.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub n0: u32,
    pub oh0: u32,
    pub ih0: u32,
    /// `None` when the band's windows lie wholly in padding (no input row to bind).
    pub shape: Option<ConvShape>,
    /// Output rows in this piece (also when `shape` is `None`).
    pub rows: u32,
    pub images: u32,
}

fn bytes(elems: u64) -> u64 {
    elems * 4
}

/// The band of output rows `oh0..oh0+rows` of one image as its own conv problem.
fn band(s: &ConvShape, oh0: u32, rows: u32) -> (u32, Option<ConvShape>) {
    let eff_r = (s.dilation.0 * (s.r - 1) + 1) as i64;
    let first = oh0 as i64 * s.stride.0 as i64 - s.pad.0 as i64;
    let end = (oh0 + rows - 1) as i64 * s.stride.0 as i64 - s.pad.0 as i64 + eff_r;
    let a = first.clamp(0, s.h as i64);
    let b = end.clamp(0, s.h as i64);
    if b <= a {
        return (0, None);
    }
    let sub = ConvShape {
        n: 1,
        h: (b - a) as u32,
        pad: ((a - first) as u32, s.pad.1),
        pad_end: ((end - b) as u32, s.pad_end.1),
        ..*s
    };
    debug_assert_eq!(sub.oh(), rows);
    (a as u32, Some(sub))
}

/// Pieces covering the whole output, each of whose x, w and y fit in `max_binding` bytes.
pub fn plan(s: &ConvShape, max_binding: u64) -> Result<Vec<Piece>> {
    if bytes(s.w_len()) > max_binding {
        return Err(Error::invalid(format!(
            "w needs {} bytes, more than the adapter's largest storage binding ({max_binding} bytes)",
            bytes(s.w_len())
        )));
    }
    let x_img = bytes(s.x_len() / s.n as u64);
    let y_img = bytes(s.y_len() / s.n as u64);
    let (oh, ow) = (s.oh(), s.ow());
    if x_img <= max_binding && y_img <= max_binding {
        let per = (max_binding / x_img.max(y_img)).clamp(1, s.n as u64) as u32;
        return Ok((0..s.n)
            .step_by(per as usize)
            .map(|n0| {
                let images = per.min(s.n - n0);
                Piece { n0, oh0: 0, ih0: 0, shape: Some(ConvShape { n: images, ..*s }), rows: oh, images }
            })
            .collect());
    }
    if let Some(r) = s.pixel_shuffle {
        // A band of conv rows lands on every r-th group of r stored rows: not one run per
        // channel or per image, and not worth the bookkeeping for images this large.
        return Err(Error::invalid(format!(
            "with pixel_shuffle={r} an image must fit one storage binding ({max_binding} bytes): \
             x needs {x_img} bytes and the output {y_img} per image; bands of rows are not supported"
        )));
    }
    if !s.padding_mode.is_zeros() {
        return Err(Error::invalid(format!(
            "with padding_mode '{}' an image must fit one storage binding ({max_binding} bytes): \
             x needs {x_img} bytes and the output {y_img} per image; bands of rows are not supported",
            s.padding_mode.name()
        )));
    }
    if s.is_transposed() {
        return Err(Error::invalid(format!(
            "a transposed convolution's image must fit one storage binding ({max_binding} bytes): \
             x needs {x_img} bytes and the output {y_img} per image; bands of rows are not supported"
        )));
    }
    // Bands of output rows: the largest band whose input and output rows both fit.
    let in_row = bytes(s.c as u64 * s.w as u64);
    let out_row = bytes(s.k as u64 * ow as u64);
    let eff_r = (s.dilation.0 * (s.r - 1) + 1) as u64;
    let fits = |rows: u64| (rows - 1) * s.stride.0 as u64 + eff_r <= max_binding / in_row.max(1)
        && rows * out_row <= max_binding;
    if !fits(1) {
        return Err(Error::invalid(format!(
            "one output row needs more than the adapter's largest storage binding \
             ({max_binding} bytes); the image is too wide for this adapter"
        )));
    }
    let mut rows = oh as u64;
    while !fits(rows) {
        rows = rows.div_ceil(2);
    }
    let rows = rows as u32;
    let mut out = Vec::new();
    for n0 in 0..s.n {
        for oh0 in (0..oh).step_by(rows as usize) {
            let r = rows.min(oh - oh0);
            let (ih0, shape) = band(s, oh0, r);
            out.push(Piece { n0, oh0, ih0, shape, rows: r, images: 1 });
        }
    }
    Ok(out)
}

/// Where a piece's input lies in the whole input: (offset, length) runs, one for whole
/// images, and for a band's rows one per channel (NCHW) or one (NHWC). The upload writes
/// them back to back.
pub fn x_runs(s: &ConvShape, p: &Piece, sub: &ConvShape) -> Vec<(usize, usize)> {
    let (h, w) = (s.h as usize, s.w as usize);
    let img = s.c as usize * h * w;
    if p.images > 1 || sub.h == s.h {
        return vec![(p.n0 as usize * img, p.images as usize * img)];
    }
    if s.layout == Layout::Nhwc {
        let row = w * s.c as usize;
        return vec![(p.n0 as usize * img + p.ih0 as usize * row, sub.h as usize * row)];
    }
    (0..s.c as usize)
        .map(|c| (p.n0 as usize * img + c * h * w + p.ih0 as usize * w, sub.h as usize * w))
        .collect()
}

/// Where the rows of a piece's output go in the whole output: (offset, length) runs.
pub fn y_runs(s: &ConvShape, p: &Piece) -> Vec<(usize, usize)> {
    let (oh, ow) = (s.oh() as usize, s.ow() as usize);
    let img = s.k as usize * oh * ow;
    if p.rows as usize == oh {
        return vec![(p.n0 as usize * img, p.images as usize * img)];
    }
    if s.layout == Layout::Nhwc {
        let row = ow * s.k as usize;
        return vec![(p.n0 as usize * img + p.oh0 as usize * row, p.rows as usize * row)];
    }
    (0..s.k as usize)
        .map(|k| (p.n0 as usize * img + k * oh * ow + p.oh0 as usize * ow, p.rows as usize * ow))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Padding;

    #[test]
    fn whole_problem_is_one_piece_when_it_fits() {
        let s = ConvShape::new([2, 3, 8, 8], [4, 3, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
        let p = plan(&s, 1 << 20).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].shape, Some(s));
    }

    #[test]
    fn images_then_bands() {
        let s = ConvShape::new([4, 2, 10, 6], [3, 2, 3, 3], (2, 1), Padding::Explicit(1, 1), (1, 1), 1, None).unwrap();
        // One image of x is 480 bytes: a 1000-byte binding holds two images.
        let p = plan(&s, 1000).unwrap();
        assert_eq!(p.len(), 2);
        // 240 bytes: bands; every output row covered exactly once, each band's shape exact.
        let p = plan(&s, 240).unwrap();
        let mut covered = vec![0; (s.n * s.oh()) as usize];
        for piece in &p {
            let sub = piece.shape.unwrap();
            assert_eq!(sub.oh(), piece.rows);
            assert!(bytes(sub.x_len()) <= 240 && bytes(sub.y_len()) <= 240);
            for r in piece.oh0..piece.oh0 + piece.rows {
                covered[(piece.n0 * s.oh() + r) as usize] += 1;
            }
        }
        assert!(covered.iter().all(|&c| c == 1));
    }

    /// Shuffled problems split into whole images (which keep their place in y) but never
    /// into bands of rows.
    #[test]
    fn shuffled_problems_split_into_images_only() {
        let s = ConvShape::new([4, 2, 10, 6], [8, 2, 3, 3], (1, 1), Padding::Explicit(1, 1), (1, 1), 1, None)
            .unwrap()
            .with_pixel_shuffle(2)
            .unwrap();
        let p = plan(&s, 2000).unwrap();
        assert!(p.len() > 1 && p.iter().all(|p| p.rows == s.oh() && p.shape.unwrap().pixel_shuffle == Some(2)));
        let e = plan(&s, 1000).unwrap_err().to_string();
        assert!(e.contains("pixel_shuffle=2") && e.contains("bands of rows"), "{e}");
    }

    #[test]
    fn band_in_padding_only_has_no_shape() {
        let s = ConvShape::new([1, 1, 2, 2], [1, 1, 1, 1], (1, 1), Padding::Explicit(5, 0), (1, 1), 1, None).unwrap();
        let (_, shape) = band(&s, 0, 1);
        assert!(shape.is_none());
    }
}
