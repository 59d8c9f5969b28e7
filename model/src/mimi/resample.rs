//! The learnt frame-rate converters between the encoder rate (25 Hz for the
//! real Mimi) and the token rate (12.5 Hz): the official `ConvDownsample1d`
//! and `ConvTrUpsample1d` as Mimi builds them (`resample_method="conv"`).
//!
//! - Down: a dense streaming conv, kernel `2·stride`, stride `stride`, no
//!   bias, **replicate** padding (a fresh slot's history is its first latent).
//! - Up: a **channel-wise** (groups = dimension, the official
//!   `upsample_channel_wise_bug=True`) streaming transposed conv, kernel
//!   `2·stride`, no bias.
//!
//! Both are plain [`StreamingConv1d`] / [`StreamingConvTr1d`] instances; this
//! file only fixes their shapes and tensor names.

use super::conv::{StreamingConv1d, StreamingConvTr1d};

/// `downsample.conv.conv.conv`: `[t][dim]` → `[t/stride][dim]`.
pub(crate) fn downsample(dim: usize, stride: usize) -> StreamingConv1d {
    StreamingConv1d::new(
        "downsample.conv.conv.conv",
        dim,
        dim,
        2 * stride,
        stride,
        1,
        false,
        true,
    )
}

/// `upsample.convtr.convtr.convtr`: `[t][dim]` → `[t·stride][dim]`.
pub(crate) fn upsample(dim: usize, stride: usize) -> StreamingConvTr1d {
    StreamingConvTr1d::new(
        "upsample.convtr.convtr.convtr",
        dim,
        dim,
        2 * stride,
        stride,
        true,
        false,
    )
}
