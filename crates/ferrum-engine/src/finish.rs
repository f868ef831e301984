//! Why a request's generation ended.

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string (OpenAI's `stop`).
    Stop,
    /// `max_tokens` or the KV capacity was reached (OpenAI's `length`).
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}
