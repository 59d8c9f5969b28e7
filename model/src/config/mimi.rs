//! The Mimi codec configuration: its types, reading from JSON, whole-config
//! validation and the built-in real Mimi.
//!
//! Invariants: a parsed [`MimiConfig`] is mono, its SEANet and transformer
//! widths agree, its quantizer is a split RVQ, and the encoder rate is an
//! integer multiple of the frame rate.

use super::reader::{is_zero, obj, Reader};
use super::{bad, read_json, ConfigError, KvWindow, NormKind};
use serde_json::Value;
use std::path::Path;

/// SEANet encoder/decoder hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SeanetConfig {
    /// Audio channels (1).
    pub channels: usize,
    /// Latent width.
    pub dimension: usize,
    /// Base filter count.
    pub n_filters: usize,
    /// Residual blocks per stage.
    pub n_residual_layers: usize,
    /// Hidden width divisor in residual blocks.
    pub compress: usize,
    /// Dilation growth per residual layer.
    pub dilation_base: usize,
    /// First/last conv kernel.
    pub kernel_size: usize,
    /// Residual conv kernel.
    pub residual_kernel_size: usize,
    /// Final conv kernel.
    pub last_kernel_size: usize,
    /// Down-sampling ratios (the encoder applies them reversed).
    pub ratios: Vec<usize>,
    /// Identity skip in residual blocks.
    pub true_skip: bool,
}

impl SeanetConfig {
    /// Samples per latent step.
    pub fn hop_length(&self) -> usize {
        self.ratios.iter().product()
    }
}

/// Split residual vector quantizer hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizerConfig {
    /// Codebook vector width.
    pub dimension: usize,
    /// Codebooks stored in the checkpoint.
    pub n_q: usize,
    /// Entries per codebook.
    pub bins: usize,
    /// Input width.
    pub input_dimension: usize,
    /// Output width.
    pub output_dimension: usize,
}

/// Mimi's streaming transformers (encoder and decoder side share this).
#[derive(Debug, Clone, PartialEq)]
pub struct MimiTransformerConfig {
    /// Width.
    pub d_model: usize,
    /// Heads.
    pub num_heads: usize,
    /// Layers.
    pub num_layers: usize,
    /// Layer scale init (its presence means `layer_scale_*` tensors exist).
    pub layer_scale: Option<f64>,
    /// Attention context in steps.
    pub context: usize,
    /// RoPE period.
    pub max_period: f32,
    /// Feed-forward width.
    pub dim_feedforward: usize,
    /// Norm kind.
    pub norm: NormKind,
    /// What the ring KV caches show a query (set from the LM's family: not
    /// a key of Mimi's configuration).
    pub kv_window: KvWindow,
}

/// The Mimi codec configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct MimiConfig {
    /// Audio sample rate (24 000).
    pub sample_rate: usize,
    /// Audio channels (1).
    pub channels: usize,
    /// Token frame rate (12.5 Hz).
    pub frame_rate: f64,
    /// SEANet.
    pub seanet: SeanetConfig,
    /// Quantizer.
    pub quantizer: QuantizerConfig,
    /// Transformers.
    pub transformer: MimiTransformerConfig,
}

impl MimiConfig {
    /// Reads and validates a Mimi config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_json(&read_json(path)?)
    }

    /// Validates a Mimi config given as JSON.
    pub fn from_json(v: &Value) -> Result<Self, ConfigError> {
        let mut r = Reader::new("", obj(v, "<root>")?);
        let sample_rate = r.usize("sample_rate")?;
        let channels = r.usize("channels")?;
        let frame_rate = r.f64("frame_rate")?;

        let sv = r.req("seanet")?;
        let mut s = Reader::new("seanet", obj(sv, "seanet")?);
        let seanet = SeanetConfig {
            channels: s.usize("channels")?,
            dimension: s.usize("dimension")?,
            n_filters: s.usize("n_filters")?,
            n_residual_layers: s.usize("n_residual_layers")?,
            compress: s.usize("compress")?,
            dilation_base: s.usize("dilation_base")?,
            kernel_size: s.usize("kernel_size")?,
            residual_kernel_size: s.usize("residual_kernel_size")?,
            last_kernel_size: s.usize("last_kernel_size")?,
            ratios: s
                .usize_list("ratios")?
                .ok_or_else(|| ConfigError::MissingKey("seanet.ratios".into()))?,
            true_skip: s.bool_or("true_skip", true)?,
        };
        s.expect("causal", |v| v.as_bool() == Some(true), "true")?;
        s.expect("activation", |v| v.as_str() == Some("ELU"), "`ELU`")?;
        s.expect("norm", |v| v.as_str() == Some("none"), "`none`")?;
        s.expect("pad_mode", |v| v.as_str() == Some("constant"), "`constant`")?;
        s.expect("disable_norm_outer_blocks", is_zero, "0")?;
        s.expect("lstm", is_zero, "0")?;
        s.skip("activation_params");
        s.finish()?;

        let qv = r.req("quantizer")?;
        let mut q = Reader::new("quantizer", obj(qv, "quantizer")?);
        let quantizer = QuantizerConfig {
            dimension: q.usize("dimension")?,
            n_q: q.usize("n_q")?,
            bins: q.usize("bins")?,
            input_dimension: q.usize("input_dimension")?,
            output_dimension: q.usize("output_dimension")?,
        };
        q.expect("n_q_semantic", |v| v.as_u64() == Some(1), "1")?;
        q.expect("no_quantization_rate", |v| v.as_f64() == Some(0.0), "0")?;
        q.finish()?;

        let tv = r.req("transformer")?;
        let mut t = Reader::new("transformer", obj(tv, "transformer")?);
        let transformer = MimiTransformerConfig {
            d_model: t.usize("d_model")?,
            num_heads: t.usize("num_heads")?,
            num_layers: t.usize("num_layers")?,
            layer_scale: t.opt_f64("layer_scale")?,
            context: t.usize("context")?,
            max_period: t.opt_f64("max_period")?.unwrap_or(10_000.0) as f32,
            dim_feedforward: t.usize("dim_feedforward")?,
            norm: NormKind::parse("transformer.norm", &t.str_or("norm", "layer_norm")?)?,
            kv_window: KvWindow::Context,
        };
        t.expect("causal", |v| v.as_bool() == Some(true), "true")?;
        t.expect("conv_layout", |v| v.as_bool() == Some(true), "true")?;
        t.expect("gating", |v| v.as_str() == Some("none"), "`none`")?;
        t.expect(
            "positional_embedding",
            |v| v.as_str() == Some("rope"),
            "`rope`",
        )?;
        let d = transformer.d_model as u64;
        t.expect("input_dimension", |v| v.as_u64() == Some(d), "d_model")?;
        t.expect(
            "output_dimensions",
            |v| {
                v.as_array()
                    .is_some_and(|a| a.len() == 1 && a[0].as_u64() == Some(d))
            },
            "[d_model]",
        )?;
        t.finish()?;
        r.finish()?;

        let cfg = MimiConfig {
            sample_rate,
            channels,
            frame_rate,
            seanet,
            quantizer,
            transformer,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.channels != 1 || self.seanet.channels != 1 {
            return Err(bad("channels", "only mono (1) is supported"));
        }
        if self.seanet.ratios.is_empty() || self.seanet.ratios.contains(&0) {
            return Err(bad(
                "seanet.ratios",
                "must be a non-empty list of positive ratios",
            ));
        }
        if self.seanet.compress == 0 || self.seanet.n_filters == 0 || self.seanet.dimension == 0 {
            return Err(bad(
                "seanet",
                "compress, n_filters and dimension must be positive",
            ));
        }
        let t = &self.transformer;
        if t.num_heads == 0
            || !t.d_model.is_multiple_of(t.num_heads)
            || !(t.d_model / t.num_heads).is_multiple_of(2)
        {
            return Err(bad(
                "transformer.num_heads",
                "must divide d_model into even head widths",
            ));
        }
        if t.d_model != self.seanet.dimension {
            return Err(bad("transformer.d_model", "must equal seanet.dimension"));
        }
        if t.norm != NormKind::LayerNorm {
            return Err(bad(
                "transformer.norm",
                "Mimi's transformers use `layer_norm`",
            ));
        }
        let q = &self.quantizer;
        if q.n_q < 2 || q.bins == 0 || q.dimension == 0 {
            return Err(bad(
                "quantizer",
                "needs n_q ≥ 2 (split RVQ), bins and dimension positive",
            ));
        }
        if q.input_dimension != self.seanet.dimension || q.output_dimension != self.seanet.dimension
        {
            return Err(bad(
                "quantizer.input_dimension",
                "must equal seanet.dimension",
            ));
        }
        let hop = self.seanet.hop_length() as f64;
        let enc_rate = self.sample_rate as f64 / hop;
        let ratio = enc_rate / self.frame_rate;
        if (ratio - ratio.round()).abs() > 1e-9 || ratio.round() < 1.0 {
            return Err(bad(
                "frame_rate",
                format!("the encoder rate {enc_rate} Hz must be an integer multiple of it"),
            ));
        }
        Ok(())
    }

    /// Encoder steps per token frame (2 for the real Mimi: 25 Hz → 12.5 Hz).
    pub fn downsample_stride(&self) -> usize {
        let enc_rate = self.sample_rate as f64 / self.seanet.hop_length() as f64;
        (enc_rate / self.frame_rate).round() as usize
    }

    /// Audio samples per token frame (1920 for the real Mimi).
    pub fn frame_samples(&self) -> usize {
        self.seanet.hop_length() * self.downsample_stride()
    }

    /// The real Mimi configuration.
    pub fn mimi_default() -> Self {
        let v = serde_json::json!({
            "sample_rate": 24000, "channels": 1, "frame_rate": 12.5,
            "seanet": {"channels": 1, "dimension": 512, "causal": true, "n_filters": 64,
                "n_residual_layers": 1, "activation": "ELU", "compress": 2, "dilation_base": 2,
                "disable_norm_outer_blocks": 0, "kernel_size": 7, "residual_kernel_size": 3,
                "last_kernel_size": 3, "norm": "none", "pad_mode": "constant",
                "ratios": [8, 6, 5, 4], "true_skip": true},
            "quantizer": {"dimension": 256, "n_q": 32, "bins": 2048,
                "input_dimension": 512, "output_dimension": 512},
            "transformer": {"d_model": 512, "num_heads": 8, "num_layers": 8, "causal": true,
                "layer_scale": 0.01, "context": 250, "conv_layout": true, "max_period": 10000,
                "gating": "none", "norm": "layer_norm", "positional_embedding": "rope",
                "dim_feedforward": 2048, "input_dimension": 512, "output_dimensions": [512]}
        });
        Self::from_json(&v).expect("the built-in Mimi config is valid")
    }
}
