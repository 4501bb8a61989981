//! Choosing the next token from a row of logits.
//!
//! Sampling runs on the host over one `f32` row per step. Randomness comes from a
//! SplitMix64 generator owned by the [`Sampler`], so a seed gives the same tokens on every
//! platform and backend (given the same logits).

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The highest logit; the lowest id among equal maxima.
    Greedy,
    /// Nucleus sampling: softmax of `logits / temperature`, restricted to the smallest set
    /// of most likely tokens whose probability reaches `top_p`, renormalized.
    TopP {
        temperature: f64,
        top_p: f64,
        seed: u64,
    },
}

/// Why a sampler could not be built or could not pick a token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("temperature {0} must be finite and positive")]
    InvalidTemperature(f64),
    #[error("top_p {0} must be in (0, 1]")]
    InvalidTopP(f64),
    #[error("logits row is empty")]
    EmptyLogits,
    #[error("logit {value} at index {index} is not finite")]
    NonFiniteLogit { index: usize, value: f32 },
}

/// A [`Sampling`] rule plus the state it needs (the random generator).
#[derive(Debug, Clone)]
pub struct Sampler {
    rule: Sampling,
    rng: SplitMix64,
}

impl Sampler {
    /// Validate `rule` and seed its generator.
    pub fn new(rule: Sampling) -> Result<Self, SamplingError> {
        let seed = match rule {
            Sampling::Greedy => 0,
            Sampling::TopP {
                temperature,
                top_p,
                seed,
            } => {
                if !(temperature.is_finite() && temperature > 0.0) {
                    return Err(SamplingError::InvalidTemperature(temperature));
                }
                if !(top_p > 0.0 && top_p <= 1.0) {
                    return Err(SamplingError::InvalidTopP(top_p));
                }
                seed
            }
        };
        Ok(Self {
            rule,
            rng: SplitMix64(seed),
        })
    }

    pub fn greedy() -> Self {
        Self {
            rule: Sampling::Greedy,
            rng: SplitMix64(0),
        }
    }

    pub fn rule(&self) -> Sampling {
        self.rule
    }

    /// Pick a token id from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        check_finite(logits)?;
        match self.rule {
            Sampling::Greedy => Ok(argmax_unchecked(logits)),
            Sampling::TopP {
                temperature, top_p, ..
            } => Ok(self.sample_top_p(logits, temperature, top_p)),
        }
    }

    fn sample_top_p(&mut self, logits: &[f32], temperature: f64, top_p: f64) -> u32 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        // Unnormalized probabilities; the largest is exactly 1.
        let weights: Vec<f64> = logits
            .iter()
            .map(|&l| ((l as f64 - max) / temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        // Descending weight, ties by lower id, so the first entry is the greedy choice.
        order.sort_unstable_by(|&a, &b| {
            weights[b as usize]
                .total_cmp(&weights[a as usize])
                .then(a.cmp(&b))
        });
        let threshold = top_p * total;
        let mut kept = 0.0;
        let mut nucleus = 0;
        for &id in &order {
            kept += weights[id as usize];
            nucleus += 1;
            if kept >= threshold {
                break;
            }
        }
        // The draw walks the nucleus in id order, as the device step's sampler does (it does
        // not sort): one seed then gives both paths the same tokens.
        let members = &mut order[..nucleus];
        members.sort_unstable();
        let mut target = self.rng.next_f64() * kept;
        for &id in members.iter() {
            target -= weights[id as usize];
            if target < 0.0 {
                return id;
            }
        }
        // Rounding left `target` at or just above zero: the last kept token.
        members[nucleus - 1]
    }

    /// The next draw in `[0, 1)` of this sampler's stream: what [`sample`](Self::sample)
    /// would use for its next token, for a sampler that runs elsewhere (the device step).
    #[cfg(feature = "cubecl")]
    pub(super) fn draw(&mut self) -> f64 {
        self.rng.next_f64()
    }
}

/// Index of the largest logit, the lowest index among equal maxima (as `torch.argmax`).
pub fn argmax(logits: &[f32]) -> Result<u32, SamplingError> {
    check_finite(logits)?;
    Ok(argmax_unchecked(logits))
}

fn argmax_unchecked(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn check_finite(logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    match logits.iter().position(|l| !l.is_finite()) {
        Some(index) => Err(SamplingError::NonFiniteLogit {
            index,
            value: logits[index],
        }),
        None => Ok(()),
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, full-period, and fixed forever, unlike a
/// library generator whose stream could change with a version bump.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    // Unit tests here because the generator is private: pin its stream to the published
    // SplitMix64 reference values (seed 1234567), so a change to it cannot go unnoticed.
    use super::SplitMix64;

    #[test]
    fn splitmix64_matches_the_reference_stream() {
        let mut rng = SplitMix64(1234567);
        let got: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            got,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423,
                4593380528125082431,
                16408922859458223821
            ]
        );
    }
}
