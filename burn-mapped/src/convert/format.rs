//! The weight format a conversion writes: [`WeightFormat`], asked for by the CLI's `--dtype`,
//! a converter's options and a cached store's name. What each stored tensor then is, its
//! manifest entry says ([`TensorEntry::format`](crate::manifest::TensorEntry::format)).

use burn::tensor::DType;

/// Float dtypes a converter can cast to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CastTo {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float (5 exponent bits).
    F16,
    /// bfloat16 (8 exponent bits, 7 fraction bits).
    BF16,
}

impl CastTo {
    /// Burn's dtype for this target.
    pub fn dtype(self) -> DType {
        match self {
            CastTo::F32 => DType::F32,
            CastTo::F16 => DType::F16,
            CastTo::BF16 => DType::BF16,
        }
    }

    /// The manifest spelling (`f32`, `f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            CastTo::F32 => "f32",
            CastTo::F16 => "f16",
            CastTo::BF16 => "bf16",
        }
    }
}

impl std::fmt::Display for CastTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The `name` was not one of `f32`, `f16`, `bf16`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a cast target (expected f32, f16 or bf16)")]
pub struct ParseCastError(pub String);

impl std::str::FromStr for CastTo {
    type Err = ParseCastError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(CastTo::F32),
            "f16" | "float16" | "half" => Ok(CastTo::F16),
            "bf16" | "bfloat16" => Ok(CastTo::BF16),
            _ => Err(ParseCastError(s.to_string())),
        }
    }
}

/// How a store holds its weights: every tensor in one float type, or the matrices a rule picks
/// (for a model, its projections and LM head) quantized and the rest f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Every float tensor in one float type.
    Float(CastTo),
    /// The picked matrices as q8 ([`crate::q8`]): int8 with one f16 scale per row.
    Q8,
    /// The picked matrices keep a GGUF's quantized blocks byte for byte ([`crate::blocks`]);
    /// a GGUF source only.
    Blocks,
}

impl WeightFormat {
    /// Every format, in the order the CLI lists them.
    pub const ALL: [WeightFormat; 5] = [
        WeightFormat::Blocks,
        WeightFormat::Q8,
        WeightFormat::Float(CastTo::F32),
        WeightFormat::Float(CastTo::F16),
        WeightFormat::Float(CastTo::BF16),
    ];

    /// The name on the command line, in cached stores' directory names and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Float(cast) => cast.name(),
            Self::Q8 => "q8",
            Self::Blocks => "blocks",
        }
    }

    /// The type of the tensors that are not quantized.
    pub fn float(self) -> CastTo {
        match self {
            Self::Float(cast) => cast,
            Self::Q8 | Self::Blocks => CastTo::F32,
        }
    }
}

impl From<CastTo> for WeightFormat {
    fn from(cast: CastTo) -> Self {
        Self::Float(cast)
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of `blocks`, `q8`, `f32`, `f16`, `bf16`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown weight format `{0}` (blocks, q8, f32, f16, bf16)")]
pub struct ParseWeightFormatError(pub String);

impl std::str::FromStr for WeightFormat {
    type Err = ParseWeightFormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "q8" => Ok(Self::Q8),
            "blocks" => Ok(Self::Blocks),
            other => other
                .parse::<CastTo>()
                .map(Self::Float)
                .map_err(|_| ParseWeightFormatError(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for format in WeightFormat::ALL {
            assert_eq!(format.name().parse::<WeightFormat>().unwrap(), format);
        }
        assert_eq!("BF16".parse::<WeightFormat>().unwrap(), CastTo::BF16.into());
        assert_eq!(
            "int4".parse::<WeightFormat>().unwrap_err().to_string(),
            "unknown weight format `int4` (blocks, q8, f32, f16, bf16)"
        );
        assert_eq!(WeightFormat::Q8.float(), CastTo::F32);
    }
}
