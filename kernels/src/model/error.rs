//! Why the GPU model could not be built or stepped.

use crate::device::DeviceError;
use moshid_model::checkpoint::DirError;
use moshid_model::config::ConfigError;
use moshid_model::weights::CheckpointError;

/// A GPU model error: the device, the checkpoint or the configuration.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A device call failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The checkpoint folder is unusable.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// A checkpoint file is unusable.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A shape or option this backend does not support.
    #[error("unsupported by the CUDA backend: {0}")]
    Unsupported(String),
}
